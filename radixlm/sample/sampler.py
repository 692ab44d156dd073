"""Sampler: one token per row of a batch of logits, every request with its own parameters and random stream.

Order of the transforms (fixed; each stage sees the output of the one before):
 1. raw logprobs, if asked: log_softmax of the model's logits (`logprobs.py`)
 2. logit_bias: z[t] += bias[t]
 3. min_tokens: eos (unless ignore_eos) and stop_token_ids get -inf while fewer than min_tokens were generated
 3b. grammar masks: tokens a constrained row's grammar does not allow next get -inf (`radixlm/structured/`)
 4. repetition penalty (HF, over prompt + output tokens)                  } `penalties.py`
 5. frequency and presence penalties (OpenAI, over output tokens)          }
 6. temperature: below 1e-5 takes the exact argmax of z (first index on ties) and skips 7-10; else z /= T;
    rows holding NaN, inf or values beyond 2**100 are then cleaned (`finite.py`: NaN is -inf, a row with no
    finite logit chooses token 0)
 7. min_p, 8. top-k, 9. top-p: one keep-threshold per row (`filters.py`)
10. draw: inverse CDF of softmax(z) over the kept tokens, in token-id order, with u = uniform number
    `num_output_tokens` of the sequence's stream (`draw.py`, `rng.py`).

All stages run as tensor ops over the rows they concern; the per-row parameter tensors (`SamplingBatch`) are
rebuilt only when the rows change, and penalty statistics are carried from step to step (`PenaltyStats`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixlm.sample.batch import SamplingBatch, SamplingRow
from radixlm.sample.draw import draw_tokens
from radixlm.sample.filters import NUM_CANDIDATES, filter_thresholds
from radixlm.sample.finite import clean_logits_, greedy_tokens, rows_are_safe
from radixlm.sample.logprobs import TokenLogprobs, gather_logprobs
from radixlm.sample.penalties import PenaltyStats, apply_penalties
from radixlm.sample.rng import stream_uniforms


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]  # per row; None for rows that did not ask


class Sampler:
    """`sampler(logits, requests)`: row i of `logits` ([B, vocab] float32, modified in place) is `requests[i]`."""

    def __init__(self, vocab_size: int, num_candidates: int = NUM_CANDIDATES,
                 greedy_kernel: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """`greedy_kernel`: the argmax of float32 CPU rows (radixlm._C's `greedy_tokens`, given by the worker), or
        None for PyTorch's (see `greedy_tokens`)."""
        self.num_candidates = num_candidates
        self.greedy_kernel = greedy_kernel
        self.penalty_stats = PenaltyStats(vocab_size)
        self._batch: SamplingBatch | None = None
        self._batch_requests: list[SamplingRow] = []  # held so that their id()s stay unique

    @torch.inference_mode()  # the runner's logits are inference tensors, and nothing here needs autograd
    def __call__(self, logits: torch.Tensor, requests: list[SamplingRow],
                 grammar_mask: Callable[[torch.Tensor], None] | None = None) -> SamplerOutput:
        """`grammar_mask(logits)`, when given, masks the constrained rows in place (stage 3b)."""
        batch = self._batch_for(requests)
        raw_logprobs = None
        if len(batch.logprob_rows):
            # a new tensor: the logits are changed in place below
            raw_logprobs = torch.log_softmax(batch.rows_of(logits, batch.logprob_rows), dim=1)
        num_outputs = torch.tensor([r.num_output_tokens for r in requests], dtype=torch.long)
        self._adjust_logits(logits, batch, requests, num_outputs, grammar_mask)
        token_ids = torch.empty(batch.num_rows, dtype=torch.long)
        if len(batch.greedy_rows):
            token_ids[batch.greedy_rows] = greedy_tokens(batch.rows_of(logits, batch.greedy_rows), self.greedy_kernel)
        if len(batch.random_rows):
            token_ids[batch.random_rows] = self._draw(logits, batch, num_outputs)
        logprobs: list[TokenLogprobs | None] = [None] * batch.num_rows
        if raw_logprobs is not None:
            gathered = gather_logprobs(raw_logprobs, token_ids[batch.logprob_rows], batch.num_top_logprobs)
            for row, entry in zip(batch.logprob_rows.tolist(), gathered, strict=True):
                logprobs[row] = entry
        return SamplerOutput(token_ids.tolist(), logprobs)

    def leaves_logits_as_they_are(self, requests: list[SamplingRow]) -> bool:
        """Whether a call for `requests` without a grammar mask only reads the logits: every row greedy, with no
        logit_bias, min_tokens ban or penalty (the stages that write in place)."""
        batch = self._batch_for(requests)
        return not (len(batch.random_rows) or len(batch.bias_rows) or len(batch.ban_rows) or len(batch.penalty_rows))

    def _batch_for(self, requests: list[SamplingRow]) -> SamplingBatch:
        same = self._batch is not None and len(requests) == len(self._batch_requests) and all(
            a is b for a, b in zip(requests, self._batch_requests, strict=True))
        if not same:
            self._batch = SamplingBatch.build(requests)
            self._batch_requests = list(requests)
        assert self._batch is not None
        return self._batch

    def _adjust_logits(self, logits: torch.Tensor, batch: SamplingBatch, requests: list[SamplingRow],
                       num_outputs: torch.Tensor, grammar_mask: Callable[[torch.Tensor], None] | None) -> None:
        """Stages 2-5: logit_bias, min_tokens bans, grammar masks, penalties."""
        if len(batch.bias_rows):
            logits.index_put_((batch.bias_rows, batch.bias_token_ids), batch.bias_values, accumulate=True)
        if len(batch.ban_rows):
            active = num_outputs[batch.ban_rows] < batch.ban_min_tokens
            logits[batch.ban_rows[active], batch.ban_token_ids[active]] = float("-inf")
        if grammar_mask is not None:
            grammar_mask(logits)
        penalty_requests = [requests[row] for row in batch.penalty_rows.tolist()]
        if penalty_requests or self.penalty_stats.output_counts.shape[0]:
            self.penalty_stats.update(penalty_requests)
        if penalty_requests:
            apply_penalties(logits, batch.penalty_rows, self.penalty_stats, batch.repetition_penalties,
                            batch.frequency_penalties, batch.presence_penalties)

    def _draw(self, logits: torch.Tensor, batch: SamplingBatch, num_outputs: torch.Tensor) -> torch.Tensor:
        """Stages 6-10 for the random rows."""
        z = batch.rows_of(logits, batch.random_rows)
        if not batch.unit_temperatures:
            z.div_(batch.temperatures[:, None])
        row_max = z.amax(1)
        if not rows_are_safe(row_max):
            row_max = clean_logits_(z)
        filtered = filter_thresholds(z, row_max, batch.min_p_logs, batch.top_ks, batch.top_ps, self.num_candidates)
        uniforms = stream_uniforms(batch.key_lows, batch.key_highs, num_outputs[batch.random_rows])
        return draw_tokens(z, row_max, filtered, uniforms)
