"""SamplingBatch: the per-row sampling parameters of one batch composition, as tensors.

Built once when the rows (the sequences sampled, in order) change and reused while they stay the same: parameters
are frozen per sequence, so only the composition can change them. Things that move every step (how many tokens
each row has generated, its penalty statistics) live outside, in the sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from radixlm.sample.rng import stream_key
from radixlm.sampling_params import SamplingParams

# Counts beyond any vocabulary or context mean the same as this cap, which int64 tensors can hold (Python's ints
# are unbounded: a top_k of 10**30 would not fit a tensor).
_INT_CAP = 2**62


class SamplingRow(Protocol):
    """What the sampler reads of a request: the engine's `Request` and the worker's `WorkerRequest` both are one."""

    request_id: str
    sampling_params: SamplingParams
    sampling_seed: int
    eos_token_ids: frozenset[int]
    all_token_ids: list[int]
    num_prompt_tokens: int

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...


def _rows(mask: list[bool]) -> torch.Tensor:
    return torch.tensor([i for i, flag in enumerate(mask) if flag], dtype=torch.long)


@dataclass
class SamplingBatch:
    """Row i holds the parameters of `requests[i]`; `*_rows` are the row indices a stage applies to."""

    num_rows: int
    greedy_rows: torch.Tensor  # temperature below 1e-5: exact argmax
    random_rows: torch.Tensor
    temperatures: torch.Tensor  # [R] of the random rows
    unit_temperatures: bool  # every temperature in `temperatures` is exactly 1: dividing by them changes nothing
    min_p_logs: torch.Tensor  # [R] ln(min_p), -inf where min_p is 0: the min_p cut in logit space
    top_ks: torch.Tensor  # [R], 0 = off
    top_ps: torch.Tensor  # [R], 1 = off
    key_lows: torch.Tensor  # [R] int64 halves of each random row's stream key
    key_highs: torch.Tensor
    bias_rows: torch.Tensor  # flat (row, token, bias) triples of every logit_bias entry
    bias_token_ids: torch.Tensor
    bias_values: torch.Tensor
    ban_rows: torch.Tensor  # flat (row, token, min_tokens): token banned while the row has fewer outputs
    ban_token_ids: torch.Tensor
    ban_min_tokens: torch.Tensor
    penalty_rows: torch.Tensor  # rows with any repetition / frequency / presence penalty
    repetition_penalties: torch.Tensor  # [P]
    frequency_penalties: torch.Tensor  # [P]
    presence_penalties: torch.Tensor  # [P]
    logprob_rows: torch.Tensor  # rows that need the raw logprob of their token (logprobs asked, or best_of)
    num_top_logprobs: list[int]  # per logprob row: how many alternatives to return (0..20)

    @classmethod
    def build(cls, requests: list[SamplingRow]) -> SamplingBatch:
        params = [r.sampling_params for r in requests]
        greedy = [p.is_greedy for p in params]
        random = [r for r, g in zip(requests, greedy, strict=True) if not g]
        random_params = [r.sampling_params for r in random]
        keys = [stream_key(r.sampling_seed) for r in random]
        penalized = [p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
                     for p in params]
        penalty_params = [p for p, flag in zip(params, penalized, strict=True) if flag]
        wants_logprobs = [needs_token_logprob(r) for r in requests]
        bias = [(row, token_id, value) for row, p in enumerate(params) for token_id, value in p.logit_bias or ()]
        bans = [(row, token_id, min(r.sampling_params.min_tokens, _INT_CAP)) for row, r in enumerate(requests)
                if r.sampling_params.min_tokens > 0 for token_id in sorted(banned_until_min_tokens(r))]
        # A temperature beyond float32's range would be inf, and inf / inf is NaN: the largest float32 is as flat.
        temperatures = torch.tensor([p.temperature for p in random_params], dtype=torch.float64).clamp_(
            max=torch.finfo(torch.float32).max).float()
        return cls(
            num_rows=len(requests),
            greedy_rows=_rows(greedy),
            random_rows=_rows([not g for g in greedy]),
            temperatures=temperatures,
            unit_temperatures=bool((temperatures == 1.0).all()),
            min_p_logs=torch.tensor([math.log(p.min_p) if p.min_p > 0 else -math.inf for p in random_params],
                                    dtype=torch.float32),
            top_ks=torch.tensor([min(p.top_k, _INT_CAP) for p in random_params], dtype=torch.long),
            top_ps=torch.tensor([p.top_p for p in random_params], dtype=torch.float32),
            key_lows=torch.tensor([k[0] for k in keys], dtype=torch.long),
            key_highs=torch.tensor([k[1] for k in keys], dtype=torch.long),
            bias_rows=torch.tensor([b[0] for b in bias], dtype=torch.long),
            bias_token_ids=torch.tensor([b[1] for b in bias], dtype=torch.long),
            bias_values=torch.tensor([b[2] for b in bias], dtype=torch.float32),
            ban_rows=torch.tensor([b[0] for b in bans], dtype=torch.long),
            ban_token_ids=torch.tensor([b[1] for b in bans], dtype=torch.long),
            ban_min_tokens=torch.tensor([b[2] for b in bans], dtype=torch.long),
            penalty_rows=_rows(penalized),
            repetition_penalties=torch.tensor([p.repetition_penalty for p in penalty_params], dtype=torch.float32),
            frequency_penalties=torch.tensor([p.frequency_penalty for p in penalty_params], dtype=torch.float32),
            presence_penalties=torch.tensor([p.presence_penalty for p in penalty_params], dtype=torch.float32),
            logprob_rows=_rows(wants_logprobs),
            num_top_logprobs=[r.sampling_params.logprobs or 0 for r, w in zip(requests, wants_logprobs, strict=True)
                              if w],
        )

    def rows_of(self, tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`tensor[rows]` for one of the `*_rows` of this batch, without copying when `rows` holds every row (the
        `*_rows` are ascending and distinct, so then they are 0..num_rows-1 in order and `tensor` is the answer)."""
        return tensor if len(rows) == self.num_rows else tensor[rows]


def needs_token_logprob(request: SamplingRow) -> bool:
    """The raw logprob of each sampled token is needed for `logprobs` and for ranking `best_of` sequences."""
    params = request.sampling_params
    return params.logprobs is not None or params.num_sequences > params.n


def banned_until_min_tokens(request: SamplingRow) -> frozenset[int]:
    """The tokens that would stop the request (eos unless ignore_eos, and stop_token_ids)."""
    params = request.sampling_params
    eos = frozenset() if params.ignore_eos else request.eos_token_ids
    return eos | frozenset(params.stop_token_ids)
