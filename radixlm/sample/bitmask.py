"""Grammar masks as data: the packed bitmask the engine's grammar matchers fill (xgrammar's layout), applied to
logits rows in plain torch, so the worker needs no grammar library."""

from __future__ import annotations

import torch


def apply_token_bitmask_(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Set `logits[rows[i], t]` to -inf for every token t that `bitmask[i]` does not allow (bit t % 32 of int32
    word t // 32); the other rows are not touched."""
    if not rows:
        return
    vocab_size = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().flatten(1)[:, :vocab_size]
    if allowed.shape[1] < vocab_size:  # tokens the grammar's vocabulary lacks are never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]))
    index = torch.tensor(rows, dtype=torch.long)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
