"""Property tests: logit_bias, min_tokens bans and penalties against slow, obviously-correct references."""

import math
from collections import Counter

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.request import Request
from radixlm.sample.penalties import PenaltyStats, apply_penalties
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams

VOCAB = 12
INF = math.inf

# Logits with ties and -inf: a few fixed values mixed with arbitrary ones.
logit_values = st.one_of(st.sampled_from([-INF, -1.0, 0.0, 1.0, 2.5]), st.floats(-20, 20, width=32))
logit_rows = st.lists(logit_values, min_size=VOCAB, max_size=VOCAB)
token_lists = st.lists(st.integers(0, VOCAB - 1), max_size=20)


def make_request(prompt, output, **params):
    request = Request("r", prompt or [0], SamplingParams(max_tokens=100, **params), eos_token_ids=frozenset({1}))
    for token_id in output:
        request.append_output_token(token_id)
    return request


def reference_penalties(row, prompt, output, repetition, frequency, presence):
    row = list(row)
    for token_id in set(prompt) | set(output):
        row[token_id] = row[token_id] / repetition if row[token_id] > 0 else row[token_id] * repetition
    for token_id, count in Counter(output).items():
        row[token_id] -= frequency * count + presence
    return row


def assert_rows_equal(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert (a == e) or math.isclose(a, e, rel_tol=1e-5, abs_tol=1e-5), (actual, expected)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(logit_rows, token_lists, token_lists, st.floats(0.1, 3.0),
                               st.floats(-2, 2), st.floats(-2, 2)), min_size=1, max_size=4))
def test_penalties_match_reference(rows):
    logits = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    requests = [make_request(prompt, output) for _, prompt, output, *_ in rows]
    stats = PenaltyStats(VOCAB)
    stats.update(requests)
    apply_penalties(logits, torch.arange(len(rows)), stats, torch.tensor([r[3] for r in rows]),
                    torch.tensor([r[4] for r in rows]), torch.tensor([r[5] for r in rows]))
    for actual, (row, _, output, repetition, frequency, presence), request in zip(
            logits.tolist(), rows, requests, strict=True):
        expected = reference_penalties(torch.tensor(row).tolist(), request.prompt_token_ids, output, repetition,
                                       frequency, presence)
        assert_rows_equal(actual, expected)


@settings(max_examples=100, deadline=None)
@given(sequences=st.lists(st.tuples(token_lists, st.lists(token_lists, min_size=1, max_size=4)),
                          min_size=1, max_size=5),
       schedule=st.lists(st.lists(st.integers(0, 4), max_size=5), min_size=1, max_size=6))
def test_penalty_stats_carried_across_steps_equal_a_fresh_count(sequences, schedule):
    """Rows come and go (composition changes) while tokens are appended; the kept statistics never drift."""
    requests = [make_request(prompt, []) for prompt, _ in sequences]
    pending = [list(chunks) for _, chunks in sequences]
    stats = PenaltyStats(VOCAB)
    for step_rows in schedule:
        rows = list(dict.fromkeys(i for i in step_rows if i < len(requests)))
        stats.update([requests[i] for i in rows])
        fresh = PenaltyStats(VOCAB)
        fresh.update([requests[i] for i in rows])
        assert torch.equal(stats.seen, fresh.seen)
        assert torch.equal(stats.output_counts, fresh.output_counts)
        assert stats.seen_cells.sort().values.tolist() == fresh.seen_cells.tolist()
        assert stats.output_cells.sort().values.tolist() == fresh.output_cells.tolist()
        for i in rows:
            for token_id in pending[i].pop(0) if pending[i] else []:
                requests[i].append_output_token(token_id)


@settings(max_examples=200, deadline=None)
@given(row=logit_rows, bias=st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-100, 100), max_size=5),
       stop_ids=st.lists(st.integers(0, VOCAB - 1), max_size=3), min_tokens=st.integers(0, 4),
       num_output=st.integers(0, 6), ignore_eos=st.booleans())
def test_bias_and_min_tokens_bans_match_reference(row, bias, stop_ids, min_tokens, num_output, ignore_eos):
    """Greedy rows expose the adjusted logits: the argmax must be the reference's first maximum."""
    request = make_request([3], [5] * num_output, temperature=0.0, logit_bias=bias, stop_token_ids=stop_ids,
                           min_tokens=min_tokens, ignore_eos=ignore_eos)
    expected = torch.tensor(row)  # float32 additions, as the sampler does them
    for token_id, value in bias.items():
        expected[token_id] += value
    expected = expected.tolist()
    if num_output < min_tokens:
        for token_id in set(stop_ids) | (set() if ignore_eos else {1}):
            expected[token_id] = -INF
    if all(v == -INF for v in expected):
        return  # every token banned: no meaningful argmax
    token = Sampler(VOCAB)(torch.tensor([row]), [request]).token_ids[0]
    assert token == min(i for i, v in enumerate(expected) if v == max(expected))


def test_only_batches_that_write_into_the_logits_need_a_copy():
    """`sample_isolated` copies the logits for its per-row retry unless the call only reads them."""
    from radixlm.sample.isolated import sample_isolated

    sampler = Sampler(VOCAB)
    greedy = [make_request([2, 3], [], temperature=0.0) for _ in range(3)]
    assert sampler.leaves_logits_as_they_are(greedy)
    for params in ({"temperature": 0.7}, {"temperature": 0.0, "logit_bias": {4: 1.0}},
                   {"temperature": 0.0, "min_tokens": 2}, {"temperature": 0.0, "repetition_penalty": 1.3}):
        assert not sampler.leaves_logits_as_they_are(greedy + [make_request([2, 3], [], **params)]), params
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    rows = greedy + [make_request([2, 3], [], temperature=0.0, logit_bias={5: 100.0}, repetition_penalty=1.3)]
    output, errors = sample_isolated(sampler, logits, rows, lambda requests: None)
    assert not errors and output.token_ids[3] == 5 and torch.equal(logits, before)
    output, errors = sample_isolated(sampler, logits, greedy, lambda requests: None)
    assert not errors and output.token_ids == logits[:3].argmax(1).tolist() and torch.equal(logits, before)
