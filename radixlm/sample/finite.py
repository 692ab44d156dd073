"""Non-finite and extreme logits, made safe for the argmax, the filters and the draw.

The model, a huge or tiny `repetition_penalty`, or a small temperature can leave NaN, +inf, or values so large
that `z - max(z)` or the top-p histogram's bucket arithmetic overflows float32 (inf - inf = NaN, and a NaN turned
into an index is out of range). The rules, the same for every row:
- NaN counts as -inf: a token whose logit is not a number is never chosen.
- Finite values and +inf are clamped to [-LOGIT_LIMIT, LOGIT_LIMIT]: order is kept (values beyond the limit tie
  with it, so tokens at +inf share the mass equally) and -inf stays -inf, so banned tokens stay banned.
- A row with no finite logit (every token banned, or NaN) chooses token 0, which is what argmax gives a row of
  -inf; it cannot be a crash. Such a row means the request's constraints leave no token (e.g. a grammar that
  only allows eos while min_tokens bans it) or the model produced NaN.

Checking is free in the common case: the sampler computes each row's max anyway, and a row is only cleaned when
its max is not a finite number within the limit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# 2**100 * BUCKETS_PER_UNIT * 2 is far below float32's max (~2**128): no arithmetic in filters.py can overflow.
LOGIT_LIMIT = 2.0**100
_NEG_INF = float("-inf")


def rows_are_safe(row_max: torch.Tensor) -> bool:
    """Whether rows with these maxima can go to the filters as they are (False for NaN, +-inf, beyond the limit)."""
    return bool((row_max.abs() <= LOGIT_LIMIT).all())


def clean_logits_(z: torch.Tensor) -> torch.Tensor:
    """Apply the module's rules to rows `z` ([N, V]) in place; returns their new maxima."""
    banned = torch.isnan(z) | (z == _NEG_INF)
    z.clamp_(-LOGIT_LIMIT, LOGIT_LIMIT).masked_fill_(banned, _NEG_INF)
    empty = banned.all(1)
    if bool(empty.any()):
        z[empty.nonzero().squeeze(1), 0] = 0.0
    return z.amax(1)


def greedy_tokens(rows: torch.Tensor, kernel: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """argmax of each row (first index on ties), NaN counting as -inf (torch's argmax would pick a NaN).

    `kernel` (radixlm._C's `greedy_tokens`, csrc/sample/greedy_tokens.cpp, which the worker passes down: this
    package does not load the extension) takes float32 CPU rows, split over the threads: 0.17 against 0.53 ms for 32
    rows of 49,152 logits in cache, 1.2 ms off a decode step of 32 rows; `greedy_tokens_reference` computes the same.
    """
    if (kernel is not None and rows.dtype == torch.float32 and rows.device.type == "cpu" and rows.dim() == 2
            and rows.shape[1] > 0 and rows.stride(-1) == 1):
        return kernel(rows)
    return greedy_tokens_reference(rows)


def greedy_tokens_reference(rows: torch.Tensor) -> torch.Tensor:
    """`greedy_tokens` in PyTorch. `max(1).indices` is the same index as `argmax(1)` (the first maximum; a NaN is the
    maximum for both) and took 0.9 ms for 64 rows of 49,152 logits on CPU, against 2.4 for `argmax`."""
    token_ids = rows.max(1).indices
    if bool(rows.gather(1, token_ids[:, None]).isnan().any()):
        token_ids = rows.nan_to_num(nan=_NEG_INF, posinf=float("inf"), neginf=_NEG_INF).max(1).indices
    return token_ids
