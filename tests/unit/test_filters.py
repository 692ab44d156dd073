"""Property tests: temperature, min_p, top-k, top-p and the inverse-CDF draw against slow references."""

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from radixlm.sample.draw import draw_tokens, inverse_cdf
from radixlm.sample.filters import filter_thresholds, nucleus_cut

INF = math.inf
MARGIN = 1e-4  # cases closer than this to a cut are float-rounding questions, not semantics: skipped

logit_values = st.one_of(st.sampled_from([-INF, -1.0, 0.0, 1.0, 2.5]), st.floats(-20, 20, width=32))
close_values = st.one_of(logit_values, st.integers(-8, 8).map(lambda k: k / 2048))  # 1/128 apart at most
row_params = st.tuples(
    st.lists(logit_values, min_size=1, max_size=30).filter(lambda row: any(v > -INF for v in row)),
    st.sampled_from([0.0, 0.0, 0.05, 0.3, 0.9]),  # min_p
    st.integers(0, 8),  # top_k
    st.sampled_from([1.0, 1.0, 0.1, 0.5, 0.9, 0.99]),  # top_p
    st.sampled_from([0.3, 0.7, 1.0, 1.5]),  # temperature
)


def reference_kept(row, min_p, top_k, top_p, temperature):
    """The kept token ids, each filter exactly as documented, in float64 with plain Python."""
    z = [v / temperature for v in row]
    finite = [i for i, v in enumerate(z) if v > -INF]
    z_max = max(z[i] for i in finite)
    kept = set(finite)
    if min_p > 0:
        ratios = {i: math.exp(z[i] - z_max) for i in finite}
        assume(all(abs(ratios[i] - min_p) > MARGIN for i in finite))
        kept = {i for i in kept if ratios[i] >= min_p}
    if top_k > 0:
        ordered = sorted((z[i] for i in kept), reverse=True)
        if len(ordered) >= top_k:
            kth = ordered[top_k - 1]
            kept = {i for i in kept if z[i] >= kth}
    if top_p < 1:
        total = sum(math.exp(z[i] - z_max) for i in kept)
        probs = {i: math.exp(z[i] - z_max) / total for i in kept}
        mass_above = {i: sum(probs[j] for j in kept if z[j] > z[i]) for i in kept}
        assume(all(abs(mass - top_p) > MARGIN for mass in mass_above.values()))
        kept = {i for i in kept if mass_above[i] < top_p}
    return z, kept


def pad(rows):
    width = max(len(row) for row in rows)
    return torch.tensor([row + [-INF] * (width - len(row)) for row in rows], dtype=torch.float32)


def run_filters(rows, num_candidates):
    z = pad([r[0] for r in rows]) / torch.tensor([[r[4]] for r in rows])
    row_max = z.amax(1)
    min_p_logs = torch.tensor([math.log(r[1]) if r[1] > 0 else -INF for r in rows])
    filtered = filter_thresholds(z, row_max, min_p_logs, torch.tensor([r[2] for r in rows]),
                                 torch.tensor([r[3] for r in rows], dtype=torch.float32), num_candidates)
    return z, row_max, filtered


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(row_params, min_size=1, max_size=5), num_candidates=st.sampled_from([1, 2, 4, 64]))
def test_filters_keep_exactly_the_reference_tokens(rows, num_candidates):
    references = [reference_kept(*row) for row in rows]
    z, _, filtered = run_filters(rows, num_candidates)
    for index, (_, kept) in enumerate(references):
        row = z[index, :len(rows[index][0])]
        actual = {i for i, v in enumerate(row.tolist()) if v > -INF and v >= filtered.thresholds[index].item()}
        assert actual == kept, (rows[index], filtered.thresholds[index])
    for group in filtered.candidates:  # candidates hold every kept token of their rows
        for row, token_ids in zip(group.rows.tolist(), group.token_ids.tolist(), strict=True):
            assert references[row][1] <= set(token_ids)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.lists(close_values, min_size=1, max_size=40).filter(lambda r: max(r) > -INF),
                               st.sampled_from([0.1, 0.5, 0.9, 0.99]), st.sampled_from([0.0, 0.05, 0.4])),
                     min_size=1, max_size=6))
def test_nucleus_histogram_cut_matches_reference(rows):
    """The histogram path alone (wide nuclei), with a min_p cut below it: same kept sets as the reference. Logits
    this close share a histogram bucket, so the exact ordering inside the crossing bucket is exercised."""
    references = [reference_kept(row, min_p, 0, top_p, 1.0)[1] for row, top_p, min_p in rows]
    z = pad([row for row, _, _ in rows])
    row_max = z.amax(1)
    base_cut = row_max + torch.tensor([math.log(min_p) if min_p else -INF for _, _, min_p in rows])
    cut = nucleus_cut(z, row_max, base_cut, torch.tensor([top_p for _, top_p, _ in rows]))
    for index, kept in enumerate(references):
        row = z[index, :len(rows[index][0])].tolist()
        assert {i for i, v in enumerate(row) if v > -INF and v >= cut[index].item()} == kept


def reference_draw(z, kept, u):
    """Token-id order, cumulative softmax weights over the kept tokens, first one past u * total."""
    z_max = max(z[i] for i in kept)
    weights = [math.exp(z[i] - z_max) if i in kept else 0.0 for i in range(len(z))]
    total = sum(weights)
    cumulative = 0.0
    for token_id, weight in enumerate(weights):
        cumulative += weight
        assume(abs(cumulative - u * total) > MARGIN * total)
        if weight > 0 and cumulative > u * total:
            return token_id
    raise AssertionError("no token drawn")


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(row_params, min_size=1, max_size=5), num_candidates=st.sampled_from([1, 2, 4, 64]),
       uniforms=st.lists(st.floats(0, 1, exclude_max=True), min_size=5, max_size=5))
def test_draw_matches_inverse_cdf_reference(rows, num_candidates, uniforms):
    references = [reference_kept(*row) for row in rows]
    expected = [reference_draw(z, kept, u) for (z, kept), u in zip(references, uniforms, strict=False)]
    z, row_max, filtered = run_filters(rows, num_candidates)
    tokens = draw_tokens(z, row_max, filtered, torch.tensor(uniforms[:len(rows)], dtype=torch.float64))
    assert tokens.tolist() == expected


@given(weights=st.lists(st.sampled_from([0.0, 0.0, 1e-30, 0.5, 1.0, 3.0]), min_size=1, max_size=12)
       .filter(lambda w: sum(w) > 0), u=st.floats(0, 1, exclude_max=True))
def test_inverse_cdf_never_draws_a_zero_weight(weights, u):
    position = inverse_cdf(torch.tensor([weights]), torch.tensor([u], dtype=torch.float64)).item()
    assert weights[position] > 0


def test_temperature_zero_is_exact_argmax_even_against_huge_logits():
    from radixlm.request import Request
    from radixlm.sample.sampler import Sampler
    from radixlm.sampling_params import SamplingParams

    logits = torch.tensor([[1e30, 1e30 * (1 + 2**-20), -INF, 5.0]])
    request = Request("r", [0], SamplingParams(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9))
    assert Sampler(4)(logits, [request]).token_ids == [1]
