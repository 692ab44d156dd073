"""Greedy outputs are identical token for token with the radix cache on and off (and equal HF generate), on
shared-prefix and multi-turn workloads, with hits ending mid-block, evictions under a small pool, and preemption."""

import pytest
import torch

from e2e.engine_runs import assert_all_blocks_released, output_token_ids
from e2e.hf_reference import hf_greedy
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams

MAX_NEW = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
CONFIGS = {
    "cache-off": dict(num_kv_blocks=400, block_size=4, enable_prefix_caching=False),
    "cache-on": dict(num_kv_blocks=400, block_size=4),
    "cache-on-lpm-chunked": dict(num_kv_blocks=400, block_size=4, schedule_policy="lpm", max_num_batched_tokens=24),
    "cache-on-small-pool": dict(num_kv_blocks=40, block_size=4, max_num_batched_tokens=64),
}


def tokens(generator, n):
    return torch.randint(3, 300, (n,), generator=generator).tolist()


def shared_prefix_prompts():
    generator = torch.Generator().manual_seed(3)
    prompts = []
    for prefix_len in (37, 22, 41):  # none is a multiple of the block size: hits end mid-block
        prefix = tokens(generator, prefix_len)
        prompts += [prefix + tokens(generator, n) for n in (5, 9, 1, 14)]
    return prompts


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.mark.parametrize("config", CONFIGS)
def test_shared_prefix_outputs_match_hf(config, llama):
    prompts = shared_prefix_prompts()
    engine = build_engine(model=str(llama), **CONFIGS[config])
    assert output_token_ids(engine, prompts, GREEDY) == hf_greedy(llama, prompts, MAX_NEW)
    manager = engine.scheduler.kv_cache_manager
    if config == "cache-off":
        assert manager.stats.num_hit_tokens == 0
    else:
        assert manager.stats.num_hit_tokens >= 9 * 20, "the shared prefixes were not reused"
        total_prompt = sum(len(p) for p in prompts)
        assert engine.scheduler.num_computed_prompt_tokens < total_prompt
    if config == "cache-on-small-pool":
        assert manager.num_evicted_blocks > 0 or engine.scheduler.num_preemptions > 0


def multi_turn(engine, num_users=3, num_rounds=3):
    """Round r+1 of each user = round r's prompt + its answer + a new turn; sent when the answer is back."""
    generator = torch.Generator().manual_seed(5)
    prompts = {user: tokens(generator, 19 + 6 * user) for user in range(num_users)}
    transcripts = {user: [] for user in range(num_users)}
    cached = []
    for round_index in range(num_rounds):
        for user, prompt in prompts.items():
            engine.add_request(f"u{user}-r{round_index}", prompt, GREEDY)
        finished = {}
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
            engine.check_invariants()
        for user in prompts:
            output = finished[f"u{user}-r{round_index}"]
            transcripts[user].append(output.outputs[0].token_ids)
            cached.append((round_index, output.num_cached_tokens, len(prompts[user])))
            prompts[user] = prompts[user] + output.outputs[0].token_ids + tokens(generator, 7)
    assert_all_blocks_released(engine)
    return transcripts, cached


@pytest.mark.parametrize("config", ["cache-on", "cache-on-small-pool", "cache-on-lpm-chunked"])
def test_multi_turn_outputs_identical_with_cache_on_and_off(config, llama):
    reference, _ = multi_turn(build_engine(model=str(llama), **CONFIGS["cache-off"]))
    transcripts, cached = multi_turn(build_engine(model=str(llama), **CONFIGS[config]))
    assert transcripts == reference
    if config != "cache-on-small-pool":
        for round_index, num_cached, prompt_len in cached:
            if round_index > 0:  # everything but the new turn (and the last answer token's K/V) is cached
                assert num_cached >= prompt_len - 7 - 1 - 4, (round_index, num_cached, prompt_len)


def test_in_batch_duplicates_wait_a_step_and_hit(llama):
    generator = torch.Generator().manual_seed(9)
    prefix = tokens(generator, 80)
    prompts = [prefix + tokens(generator, 3) for _ in range(4)]
    engine = build_engine(model=str(llama), num_kv_blocks=400, block_size=4)
    assert output_token_ids(engine, prompts, GREEDY) == hf_greedy(llama, prompts, MAX_NEW)
    # the prefix is computed once: 80 + 4 x 3 suffix tokens (+1 per request for the partial-block boundary)
    assert engine.scheduler.num_computed_prompt_tokens <= 80 + 4 * 3 + 4


def test_preempted_request_resumes_from_its_own_cached_prefix(llama):
    generator = torch.Generator().manual_seed(11)
    prompts = [tokens(generator, 30) for _ in range(4)]
    engine = build_engine(model=str(llama), num_kv_blocks=30, block_size=4, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    assert output_token_ids(engine, prompts, params) == hf_greedy(llama, prompts, 20)
    assert engine.scheduler.num_preemptions > 0
