"""The whole Sampler against a plain-Python pipeline in the documented order, on random batches of requests."""

import math
from collections import Counter

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from radixlm.request import Request
from radixlm.sample.rng import stream_key, stream_uniforms
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams

VOCAB = 10
EOS = 1
INF = math.inf
MARGIN = 1e-3

params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.integers(0, 5), top_p=st.sampled_from([1.0, 0.3, 0.8]), min_p=st.sampled_from([0.0, 0.1, 0.5]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.8]), frequency_penalty=st.sampled_from([0.0, 0.5, -0.4]),
    presence_penalty=st.sampled_from([0.0, 0.7]),
    logit_bias=st.dictionaries(st.integers(0, VOCAB - 1), st.sampled_from([-100.0, -2.0, 3.0]), max_size=2),
    min_tokens=st.integers(0, 3), stop_token_ids=st.lists(st.integers(2, VOCAB - 1), max_size=2),
    seed=st.integers(0, 2**64 - 1), max_tokens=st.just(50), logprobs=st.sampled_from([None, 0, 3]),
)
row_strategy = st.tuples(params_strategy, st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
                         st.lists(st.integers(0, VOCAB - 1), max_size=6),
                         st.lists(st.floats(-8, 8, width=32), min_size=VOCAB, max_size=VOCAB))


def reference_token(params, prompt, output, row, u):
    """Every stage exactly as the sampler's docstring orders them, in float64."""
    z = list(row)
    for token_id, bias in params.logit_bias or ():
        z[token_id] += bias
    if len(output) < params.min_tokens:
        for token_id in set(params.stop_token_ids) | {EOS}:
            z[token_id] = -INF
    for token_id in set(prompt) | set(output):
        r = params.repetition_penalty
        z[token_id] = z[token_id] / r if z[token_id] > 0 else z[token_id] * r
    for token_id, count in Counter(output).items():
        z[token_id] -= params.frequency_penalty * count + params.presence_penalty
    if params.temperature == 0:
        best = max(z)
        assume(sorted(z)[-2] < best - MARGIN or z.count(best) > 1)
        return z.index(best)
    z = [v / params.temperature for v in z]
    z_max = max(z)
    weight = {i: math.exp(v - z_max) for i, v in enumerate(z) if v > -INF}
    kept = {i for i, w in weight.items() if w >= params.min_p}
    assume(all(abs(w - params.min_p) > MARGIN for w in weight.values()))
    if params.top_k and len(kept) >= params.top_k:
        kth = sorted((z[i] for i in kept), reverse=True)[params.top_k - 1]
        assume(all(abs(z[i] - kth) > MARGIN or z[i] == kth for i in kept))
        kept = {i for i in kept if z[i] >= kth}
    total = sum(weight[i] for i in kept)
    mass_above = {i: sum(weight[j] for j in kept if z[j] > z[i]) / total for i in kept}
    assume(all(abs(m - params.top_p) > MARGIN for m in mass_above.values()))
    kept = {i for i in kept if mass_above[i] < params.top_p}
    total = sum(weight[i] for i in kept)
    cumulative = 0.0
    for token_id in sorted(kept):
        cumulative += weight[token_id]
        assume(abs(cumulative - u * total) > MARGIN * total)
        if cumulative > u * total:
            return token_id
    raise AssertionError("nothing drawn")


def uniform_of(seed, counter):
    low, high = stream_key(seed)
    return stream_uniforms(torch.tensor([low]), torch.tensor([high]), torch.tensor([counter])).item()


def make_request(index, params, prompt, output):
    request = Request(str(index), prompt, params, eos_token_ids=frozenset({EOS}), sampling_seed=params.seed)
    for token_id in output:
        request.append_output_token(token_id)
    return request


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(row_strategy, min_size=1, max_size=6))
def test_sampler_follows_the_documented_order(rows):
    requests = [make_request(i, *row[:3]) for i, row in enumerate(rows)]
    expected = [reference_token(params, prompt, output, row, uniform_of(params.seed, len(output)))
                for params, prompt, output, row in rows]
    logits = torch.tensor([row[3] for row in rows], dtype=torch.float32)
    raw = torch.log_softmax(logits.double(), dim=1)
    result = Sampler(VOCAB, num_candidates=2)(logits, requests)
    assert result.token_ids == expected
    for (params, *_), token_id, entry, raw_row in zip(rows, expected, result.logprobs, raw, strict=True):
        if params.logprobs is None:
            assert entry is None
            continue
        assert entry.token_id == token_id  # raw model logprobs, before any transform
        assert math.isclose(entry.logprob, raw_row[token_id].item(), abs_tol=1e-5)
        value = raw_row[token_id].item()  # (float32 log-softmax cannot tell logits 1e-7 apart: a tolerance)
        assert 1 + sum(v > value + 1e-5 for v in raw_row.tolist()) <= entry.rank <= \
            1 + sum(v > value - 1e-5 for v in raw_row.tolist())
        assert len(entry.top_token_ids) == len(entry.top_logprobs) == params.logprobs
        best = sorted(raw_row.tolist(), reverse=True)[:params.logprobs]
        assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(entry.top_logprobs, best, strict=True))
        assert all(math.isclose(raw_row[t].item(), v, abs_tol=1e-5)
                   for t, v in zip(entry.top_token_ids, entry.top_logprobs, strict=True))


def test_same_rows_reuse_the_batch_and_new_rows_rebuild_it():
    sampler = Sampler(VOCAB)
    requests = [make_request(i, SamplingParams(seed=i), [3], []) for i in range(3)]
    sampler(torch.zeros(3, VOCAB), requests)
    batch = sampler._batch
    sampler(torch.zeros(3, VOCAB), requests)
    assert sampler._batch is batch
    sampler(torch.zeros(2, VOCAB), requests[1:])
    assert sampler._batch is not batch and sampler._batch.num_rows == 2
