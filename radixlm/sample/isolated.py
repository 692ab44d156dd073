"""Sampling with per-row fault isolation: an exception raised for one row (its parameters, its grammar mask, a
numerical corner) must cost that row's request alone, never the batch."""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.sample.batch import SamplingRow
from radixlm.sample.sampler import Sampler, SamplerOutput

MaskFor = Callable[[list[SamplingRow]], Callable[[torch.Tensor], None] | None]


def sample_isolated(sampler: Sampler, logits: torch.Tensor, requests: list[SamplingRow],
                    mask_for: MaskFor) -> tuple[SamplerOutput, dict[int, Exception]]:
    """Sample every row in one batched call. If that raises, sample each row alone from the untouched logits, so
    the rows that succeed get exactly the tokens the batched call gives them (every row's draw depends only on its
    own logits, parameters and stream). Returns the output (rows that failed hold token -1 and no logprobs) and the
    exception of each failed row.

    `logits` is not modified; `mask_for(rows)` returns the grammar masking stage for those rows (or None).
    """
    try:
        mask = mask_for(requests)
        # The copy keeps the logits untouched for the per-row retry below; a batch of greedy rows that nothing writes
        # into reads them only (the copy was about 0.5 ms of a 45 ms step at 32 rows of 49,152 logits).
        untouched = mask is None and sampler.leaves_logits_as_they_are(requests)
        return sampler(logits if untouched else logits.clone(), requests, mask), {}
    except Exception:  # find the rows it belongs to
        pass
    token_ids: list[int] = []
    logprobs = []
    errors: dict[int, Exception] = {}
    for row, request in enumerate(requests):
        try:
            single = sampler(logits[row:row + 1].clone(), [request], mask_for([request]))
        except Exception as error:
            errors[row] = error
            token_ids.append(-1)
            logprobs.append(None)
            continue
        token_ids += single.token_ids
        logprobs += single.logprobs
    return SamplerOutput(token_ids, logprobs), errors
