"""Chi-square: sampled frequencies match softmax(logits / T) restricted by min_p / top-k / top-p (fixed seeds)."""

import math

import pytest
import torch

from radixlm.request import Request
from radixlm.sample.draw import draw_tokens
from radixlm.sample.filters import filter_thresholds
from radixlm.sample.rng import stream_key, stream_uniforms
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams

LOGITS = [2.0, 1.5, 1.5, 0.3, -0.5, -1.0, 0.9, -3.0]  # a tie, and a long tail
NUM_DRAWS = 20000
CASES = {  # name: (temperature, min_p, top_k, top_p)
    "plain": (1.0, 0.0, 0, 1.0),
    "cold": (0.5, 0.0, 0, 1.0),
    "top-k": (0.7, 0.0, 3, 1.0),  # the k-th token ties with the 4th: both are kept
    "top-p": (1.3, 0.0, 0, 0.8),
    "min-p": (1.0, 0.15, 0, 1.0),
    "all": (0.9, 0.05, 5, 0.9),
}


def expected_probabilities(temperature, min_p, top_k, top_p):
    """softmax(logits / T), then the filters as documented, renormalised (float64, plain Python)."""
    z = [v / temperature for v in LOGITS]
    weights = [math.exp(v - max(z)) for v in z]
    kept = {i for i, w in enumerate(weights) if w >= min_p}
    if top_k:
        kth = sorted((z[i] for i in kept), reverse=True)[top_k - 1]
        kept = {i for i in kept if z[i] >= kth}
    total = sum(weights[i] for i in kept)
    kept = {i for i in kept if sum(weights[j] for j in kept if z[j] > z[i]) / total < top_p}
    total = sum(weights[i] for i in kept)
    return [weights[i] / total if i in kept else 0.0 for i in range(len(z))]


def chi_square_p_value(counts, probabilities):
    """Upper tail of the chi-square statistic over the tokens that can be drawn."""
    cells = [(c, p * sum(counts)) for c, p in zip(counts, probabilities, strict=True) if p > 0]
    statistic = sum((c - e) ** 2 / e for c, e in cells)
    degrees = len(cells) - 1
    return torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64),
                                   torch.tensor(statistic / 2, dtype=torch.float64)).item()


def check_counts(tokens, probabilities):
    counts = torch.bincount(tokens, minlength=len(LOGITS)).tolist()
    for count, probability in zip(counts, probabilities, strict=True):
        assert probability > 0 or count == 0, f"a filtered-out token was drawn: {counts}"
    p_value = chi_square_p_value(counts, probabilities)
    assert p_value > 1e-3, f"counts {counts} vs probabilities {probabilities}: p = {p_value:.2g}"


@pytest.mark.parametrize("case", CASES)
def test_one_stream_draws_the_filtered_distribution(case):
    """One seed, counters 0..N-1: the stream of a single long generation."""
    temperature, min_p, top_k, top_p = CASES[case]
    z = torch.tensor([LOGITS], dtype=torch.float32).expand(NUM_DRAWS, -1) / temperature
    row_max = z.amax(1)
    full = torch.full((NUM_DRAWS,), 1.0)
    filtered = filter_thresholds(z, row_max, full * (math.log(min_p) if min_p else -math.inf),
                                 torch.full((NUM_DRAWS,), top_k), full * top_p)
    key_low, key_high = stream_key(1234)
    uniforms = stream_uniforms(torch.full((NUM_DRAWS,), key_low), torch.full((NUM_DRAWS,), key_high),
                               torch.arange(NUM_DRAWS))
    check_counts(draw_tokens(z, row_max, filtered, uniforms), expected_probabilities(*CASES[case]))


@pytest.mark.parametrize("case", ["plain", "all"])
def test_many_seeds_through_the_sampler_draw_the_filtered_distribution(case):
    """Seeds 0..N-1 at their first token, through the whole Sampler: what n > 1 forks rely on."""
    temperature, min_p, top_k, top_p = CASES[case]
    params = [SamplingParams(temperature=temperature, min_p=min_p, top_k=top_k, top_p=top_p, seed=seed)
              for seed in range(NUM_DRAWS)]
    requests = [Request(str(i), [0], p, sampling_seed=p.seed) for i, p in enumerate(params)]
    logits = torch.tensor([LOGITS], dtype=torch.float32).repeat(NUM_DRAWS, 1)
    tokens = torch.tensor(Sampler(len(LOGITS))(logits, requests).token_ids)
    check_counts(tokens, expected_probabilities(*CASES[case]))
