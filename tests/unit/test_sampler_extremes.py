"""Extreme temperatures and logits (NaN, +-inf, float32's max, denormals) through every filter combination.

Whatever the values, the sampler returns ids in range that its rules allow (`radixlm/sample/finite.py`): never a
token whose adjusted logit is NaN or -inf while another token is allowed, token 0 for a row with none, greedy
below temperature 1e-5, and top-k / min_p / top-p cuts that hold on the cleaned logits.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.model.ops import direct_kernel, kernels_available
from radixlm.request import Request
from radixlm.sample.finite import LOGIT_LIMIT, clean_logits_, greedy_tokens, greedy_tokens_reference
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams

VOCAB = 40
NUM_CANDIDATES = 4  # small, so that wide rows take the top-p histogram path (`nucleus_cut`)
INF, NAN = math.inf, math.nan
F32_MAX = float(torch.finfo(torch.float32).max)
EXTREMES = [NAN, INF, -INF, F32_MAX, -F32_MAX, 1e-45, -1e-45, 0.0, 1e30, -1e30, 2.0**100, 88.0]

extreme_logits = st.one_of(st.sampled_from(EXTREMES), st.floats(-30, 30, width=32),
                           st.floats(allow_nan=True, allow_infinity=True, width=32))
temperatures = st.sampled_from([0.0, 1e-45, 1e-38, 1e-6, 1e-5, 0.01, 0.7, 1.0, 1e5, 1e38, 1e300])
row_params = st.fixed_dictionaries({
    "temperature": temperatures,
    "min_p": st.sampled_from([0.0, 0.0, 1e-45, 0.1, 0.5, 1.0]),
    "top_k": st.sampled_from([0, 0, 1, 3, 10, VOCAB + 5]),
    "top_p": st.sampled_from([1.0, 1.0, 1e-45, 0.1, 0.5, 0.99]),
    "repetition_penalty": st.sampled_from([1.0, 1.0, 1e-45, 0.5, 2.0, 1e38, 1e300]),
    "frequency_penalty": st.sampled_from([0.0, -2.0, 2.0]),
    "presence_penalty": st.sampled_from([0.0, -2.0, 2.0]),
    "logit_bias": st.dictionaries(st.integers(0, VOCAB - 1), st.sampled_from([-100.0, 100.0, 1e-45, 5.0]),
                                  max_size=3),
    "seed": st.integers(0, 2**32),
})
rows = st.tuples(st.lists(extreme_logits, min_size=VOCAB, max_size=VOCAB), row_params,
                 st.lists(st.integers(0, VOCAB - 1), max_size=4))


def make_request(params: dict, output_ids: list[int]) -> Request:
    request = Request("r", [1, 2], SamplingParams(max_tokens=100, **params), eos_token_ids=frozenset({3}),
                      sampling_seed=params.get("seed") or 0)
    for token_id in output_ids:
        request.append_output_token(token_id)
    return request


def adjusted_logits(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """Stages 2-5 (bias, bans, penalties) alone, on a copy, with a sampler of its own."""
    sampler = Sampler(VOCAB)
    adjusted = logits.clone()
    num_outputs = torch.tensor([r.num_output_tokens for r in requests])
    sampler._adjust_logits(adjusted, sampler._batch_for(requests), requests, num_outputs, None)
    return adjusted


def check_row(token: int, adjusted: torch.Tensor, params: SamplingParams) -> None:
    assert 0 <= token < VOCAB
    allowed = ~torch.isnan(adjusted) & (adjusted > -INF)
    if not bool(allowed.any()):
        assert token == 0, "a row with no finite logit chooses token 0"
        return
    assert bool(allowed[token]), f"token {token} has adjusted logit {adjusted[token]}"
    if params.is_greedy:
        assert token == int(adjusted.nan_to_num(nan=-INF, posinf=INF, neginf=-INF).argmax())
        return
    temperature = min(params.temperature, F32_MAX)
    z = adjusted / torch.tensor(temperature, dtype=torch.float32)
    clean_logits_(z[None])
    kept_z = z[token].item()
    assert int((z > kept_z).sum()) < (params.top_k or VOCAB), "outside top-k"
    z64 = z.double()
    if params.min_p > 0:
        assert kept_z >= z64.max().item() + math.log(params.min_p) - 1e-3 * max(1.0, abs(kept_z)), "below min_p"
    if params.top_p < 1.0:
        weights = torch.exp(z64 - z64.max())
        above = weights[z64 > kept_z].sum().item() / weights.sum().item()
        assert above < params.top_p + 1e-3, "outside the nucleus"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(batch=st.lists(rows, min_size=1, max_size=4))
def test_extreme_logits_and_temperatures_sample_allowed_tokens(batch):
    requests = [make_request(params, output_ids) for _, params, output_ids in batch]
    logits = torch.tensor([row for row, _, _ in batch], dtype=torch.float32)
    expected_rows = adjusted_logits(logits, requests)
    token_ids = Sampler(VOCAB, num_candidates=NUM_CANDIDATES)(logits.clone(), requests).token_ids
    for token, adjusted, request in zip(token_ids, expected_rows, requests, strict=True):
        check_row(token, adjusted, request.sampling_params)


@pytest.mark.parametrize("temperature", [1e-45, 1e-38, 1e-6])
@pytest.mark.parametrize("filters", [{}, {"top_p": 0.5}, {"min_p": 0.5}, {"top_p": 0.5, "min_p": 0.5}])
def test_tiny_temperatures_are_greedy(temperature, filters):
    """Issue 10's rows: 1e-45 with top_p 0.5 or min_p 0.5 crashed the engine, 1e-38 sampled garbage."""
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 10
    requests = [make_request({"temperature": temperature, "seed": seed, **filters}, []) for seed in range(3)]
    token_ids = Sampler(VOCAB, num_candidates=NUM_CANDIDATES)(logits.clone(), requests).token_ids
    assert token_ids == logits.argmax(1).tolist()


def test_rows_without_a_finite_logit_choose_token_zero():
    logits = torch.tensor([[NAN] * VOCAB, [-INF] * VOCAB, [NAN, -INF] * (VOCAB // 2)])
    requests = [make_request({"temperature": t, "top_p": 0.5}, []) for t in (1.0, 0.0, 0.7)]
    assert Sampler(VOCAB)(logits, requests).token_ids == [0, 0, 0]


def test_nan_is_never_chosen_and_inf_tokens_share_the_mass():
    logits = torch.full((1, VOCAB), NAN)
    logits[0, 7] = logits[0, 11] = INF
    logits[0, 5] = 3.0
    seen = {Sampler(VOCAB)(logits.clone(), [make_request({"seed": seed}, [])]).token_ids[0] for seed in range(40)}
    assert seen == {7, 11}
    greedy = make_request({"temperature": 0.0}, [])
    assert Sampler(VOCAB)(logits.clone(), [greedy]).token_ids == [7]


def test_clean_logits_keeps_order_and_bans():
    z = torch.tensor([[NAN, -INF, INF, -F32_MAX, 1.0, 2.0 * LOGIT_LIMIT]])
    row_max = clean_logits_(z)
    assert z.tolist() == [[-INF, -INF, LOGIT_LIMIT, -LOGIT_LIMIT, 1.0, LOGIT_LIMIT]]
    assert row_max.tolist() == [LOGIT_LIMIT]


@pytest.mark.parametrize("value", [INF, -INF, NAN, -1e-45])
def test_non_finite_or_negative_temperature_is_refused(value):
    with pytest.raises(ValueError, match=r"^temperature"):
        SamplingParams(temperature=value)


@pytest.mark.parametrize(("temperature", "greedy"), [(0.0, True), (1e-45, True), (9.99e-6, True), (1e-5, False)])
def test_greedy_below_1e_minus_5(temperature, greedy):
    assert SamplingParams(temperature=temperature).is_greedy is greedy


def test_greedy_tokens_take_the_first_maximum_and_skip_nan():
    torch.manual_seed(0)
    rows = torch.randn(64, 1000).round()  # many ties for the maximum
    rows[3, 10:20] = INF
    rows[4] = -INF
    assert torch.equal(greedy_tokens(rows), rows.argmax(1))
    rows[5, 7] = float("nan")
    rows[5, 9] = 50.0
    assert int(greedy_tokens(rows)[5]) == 9


@pytest.mark.skipif(not kernels_available(), reason="radixlm._C is not built")
@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 40, 1000, 49_152])
def test_greedy_kernel_equals_the_reference(vocab):
    """radixlm._C's greedy_tokens against `greedy_tokens_reference`: ties, NaN, +-inf, rows of only NaN or -inf,
    a row whose only number sits in the vector loop's tail, strided rows (a view of every other row)."""
    torch.manual_seed(vocab)
    rows = torch.randn(40, vocab).round()  # many ties for the maximum
    rows[1] = float("nan")
    rows[2] = -INF
    rows[3, ::2] = float("nan")
    rows[3, 1::2] = -INF
    rows[4, -1] = INF
    rows[5, vocab // 2] = float("nan")
    rows[6] = float("nan")
    rows[6, -1] = -3.0
    rows[7, ::3] = INF
    rows[8] = 1e-45
    rows[9] = -LOGIT_LIMIT
    kernel = direct_kernel("greedy_tokens")
    assert torch.equal(kernel(rows), greedy_tokens_reference(rows))
    assert torch.equal(kernel(rows[::2]), greedy_tokens_reference(rows[::2]))
    assert torch.equal(greedy_tokens(rows, kernel), greedy_tokens_reference(rows))
    greedy = [make_request({"temperature": 0.0}, []) for _ in range(len(rows))]
    sampler = Sampler(VOCAB, greedy_kernel=kernel)
    if vocab == VOCAB:
        assert sampler(rows.clone(), greedy).token_ids == greedy_tokens_reference(rows).tolist()


@pytest.mark.skipif(not kernels_available(), reason="radixlm._C is not built")
@pytest.mark.parametrize("logits", [torch.zeros(3, 0), torch.zeros(4), torch.zeros(2, 5, dtype=torch.bfloat16),
                                    torch.zeros(6, 4).t()])
def test_greedy_kernel_refuses_what_it_does_not_take(logits):
    with pytest.raises(RuntimeError):
        direct_kernel("greedy_tokens")(logits)
