"""Speculative decoding without a model: the n-gram search, the config, the verification rule (exact per seed and
in distribution: a chi-square test), and the scheduler's budget for drafts."""

import pytest
import torch

from radixlm.config import SchedulerConfig, SpeculativeConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.request import Request
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams
from radixlm.speculative.drafter import NgramDrafter
from radixlm.speculative.ngram import find_draft
from radixlm.worker.worker import accepted_length
from radixlm.worker.worker_request import WorkerRequest
from unit.fake_engine import runner_output, step


def test_find_draft_continues_the_latest_occurrence_of_the_longest_ngram():
    assert find_draft([1, 2, 3, 4, 5, 9, 1, 2, 3], 3, 3, 1) == [4, 5, 9]
    assert find_draft([7, 1, 2, 8, 1, 2], 2, 2, 1) == [8, 1]  # the most recent "1 2"
    assert find_draft([5, 1, 6, 2, 9, 2], 4, 3, 2) == []  # no 2-gram repeats; 1-grams are below the minimum
    assert find_draft([5, 1, 6, 2, 9, 2], 4, 3, 1) == [9, 2]
    assert find_draft([256, 1, 2, 256], 2, 1, 1) == [1, 2]  # token ids whose bytes could match out of step
    assert find_draft([1, 1 << 8, 1 << 16], 1, 1, 1) == []
    assert find_draft([3], 4, 2, 1) == [] and find_draft([1, 2, 1, 2], 0, 2, 1) == []


def test_speculative_config_validates_every_key():
    assert SpeculativeConfig.parse('{"prompt_lookup_max": 3}').prompt_lookup_min == 2
    assert SpeculativeConfig.parse({"prompt_lookup_min": 7}).prompt_lookup_max == 7
    for bad, field in [("{", "JSON"), ('{"method": "eagle"}', "method"), ('{"num_speculative_tokens": 0}',
                                                                           "num_speculative_tokens"),
                       ('{"num_speculative_tokens": 1e9}', "num_speculative_tokens"), ('{"k": 1}', "'k'"),
                       ('{"prompt_lookup_min": 5, "prompt_lookup_max": 2}', "prompt_lookup_min"), ("[]", "object")]:
        with pytest.raises(ValueError, match=field):
            SchedulerConfig(speculative_config=bad)


def _state(seed: int, params: SamplingParams) -> WorkerRequest:
    return WorkerRequest("r", [1, 2, 3], 3, params.replace(seed=seed), seed, frozenset())


def test_verification_draws_exactly_the_tokens_of_plain_decoding_and_their_distribution():
    vocab, num_seeds = 6, 3000
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, vocab, generator=generator) * 1.5  # row 0: after the last token; row 1: after the draft
    probabilities = torch.softmax(logits, dim=1)
    draft = int(probabilities[0].argmax())  # a draft right often enough to test both rows
    params = SamplingParams(temperature=1.0, max_tokens=10)
    sampler = Sampler(vocab)
    firsts, seconds = torch.zeros(vocab), torch.zeros(vocab)
    for seed in range(num_seeds):
        state = _state(seed, params)
        sampled = sampler(logits.clone(), [state, state.draft_row([draft])]).token_ids
        kept = sampled[:accepted_length([draft], sampled)]
        plain = [sampler(logits[:1].clone(), [state]).token_ids[0]]  # plain decoding, one token at a time
        if plain[0] == draft:
            state.all_token_ids.append(draft)
            plain.append(sampler(logits[1:].clone(), [state]).token_ids[0])
        assert kept == plain, seed
        firsts[kept[0]] += 1
        if len(kept) == 2:
            seconds[kept[1]] += 1
    chi2 = lambda counts, p: float(((counts - counts.sum() * p) ** 2 / (counts.sum() * p)).sum())  # noqa: E731
    critical = 20.5  # chi-square, 5 degrees of freedom, p = 0.001
    assert chi2(firsts, probabilities[0]) < critical
    assert seconds.sum() > 200 and chi2(seconds, probabilities[1]) < critical


def test_penalties_and_min_tokens_count_the_drafts_before_a_row():
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=5, repetition_penalty=50.0)
    state = WorkerRequest("r", [1, 2, 3], 3, params, 0, frozenset({4}))
    row = state.draft_row([5, 5])
    assert (row.num_output_tokens, row.all_token_ids) == (2, [1, 2, 3, 5, 5])
    logits = torch.full((2, 8), -10.0)
    logits[:, 5] = -1.0  # token 5 wins unless penalized (drafted before row 1: -1 * 50)
    logits[:, 4] = -2.0  # eos: banned until min_tokens
    out = Sampler(8)(logits, [state, row]).token_ids
    assert out == [5, 0]


def test_drafts_never_take_a_decodes_token_and_back_off_before_preemption():
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=4), KVCacheManager(64, 4), 512)
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", [10 + i, 11, 12], SamplingParams(max_tokens=20)))
    while any(r.num_output_tokens == 0 for r in scheduler.requests.values()):
        step(scheduler)
    for request in scheduler.running:
        request.draft_token_ids = [1, 2, 3]
    output = scheduler.schedule()
    assert sorted(c.num_tokens for c in output.chunks) == [1, 1, 2]  # one spare token of the budget for drafts
    scheduler.update_from_output(output, runner_output(output, {c.request_id: [9] for c in output.chunks}))
    tight = Scheduler(SchedulerConfig(), KVCacheManager(2, 4), 512)
    tight.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20)))
    step(tight)
    tight.running[0].draft_token_ids = [4, 5, 6, 7, 8, 9]
    output = tight.schedule()  # drafts need a third block: they are dropped, nobody is preempted
    assert output.chunks[0].num_tokens == 1 and not output.preempted_request_ids


def test_the_drafter_adapts_each_request_and_stops_one_that_never_hits():
    drafter = NgramDrafter(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1))
    scheduler = Scheduler(SchedulerConfig(), KVCacheManager(64, 4), 512)
    scheduler.add_request(Request("r", [1, 2, 3, 1, 2, 3, 1], SamplingParams(max_tokens=200)))
    step(scheduler, token_id=2)
    request = scheduler.running[0]
    for _ in range(12):
        output = scheduler.schedule(drafter.propose(scheduler.running))
        drafts = output.chunks[0].num_draft_tokens
        draft = output.chunks[0].token_ids[1:2]
        kept = {"r": [2 if draft == [1] else 1]}  # the model never agrees, yet the text keeps repeating
        drafter.record(output, kept)
        scheduler.update_from_output(output, runner_output(output, kept))
        if not drafts:
            break
    assert request.draft_token_ids == [] and drafter.stats.num_accepted_tokens == 0
    assert drafter.stats.num_drafts == 8  # then it stopped drafting


def test_spec_decode_metrics_count_the_deltas_between_snapshots():
    from radixlm.metrics import EngineMetrics, SchedulerStats

    metrics = EngineMetrics("m")
    metrics.observe_scheduler(SchedulerStats(0, 0, 0.0, 0.0, 0, num_spec_drafts=2, num_spec_draft_tokens=8,
                                             num_spec_accepted_tokens=5, num_spec_accepted_tokens_per_pos=(2, 2, 1)))
    metrics.observe_scheduler(SchedulerStats(0, 0, 0.0, 0.0, 0, num_spec_drafts=3, num_spec_draft_tokens=10,
                                             num_spec_accepted_tokens=6, num_spec_accepted_tokens_per_pos=(3, 2, 1)))
    text = metrics.render().decode()
    for line in ['radixlm:spec_decode_num_drafts_total{model_name="m"} 3.0',
                 'radixlm:spec_decode_num_draft_tokens_total{model_name="m"} 10.0',
                 'radixlm:spec_decode_num_accepted_tokens_total{model_name="m"} 6.0',
                 'radixlm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 3.0',
                 'radixlm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0']:
        assert line in text, line
