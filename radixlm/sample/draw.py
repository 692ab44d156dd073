"""Drawing one token per row by inverse CDF, from one uniform number per row.

The kept tokens of a row are laid out in token-id order and the first one whose cumulative weight exceeds
`u * total` is drawn. Token-id order (not the candidates' order) makes the draw a function of the filtered
distribution and `u` alone, whichever candidate size a row needed: the same `u` always picks the same token.
"""

from __future__ import annotations

import torch

from radixlm.sample.filters import Filtered, kept_weights, mask_below


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Positions drawn from rows of non-negative `weights` ([N, K]) with `uniforms` ([N], in [0, 1)).

    A position of weight 0 is never drawn (if rounding lands there, the last positive weight is taken).
    """
    cdf = weights.cumsum(1)
    targets = (uniforms * cdf[:, -1].double()).to(cdf.dtype)
    positions = torch.searchsorted(cdf, targets[:, None], right=True).squeeze(1).clamp_(max=weights.shape[1] - 1)
    empty = weights.gather(1, positions[:, None]).squeeze(1) <= 0
    if bool(empty.any()):
        positive = (weights[empty] > 0).flip(1).int()
        positions[empty] = weights.shape[1] - 1 - positive.argmax(1)
    return positions


def draw_tokens(z: torch.Tensor, row_max: torch.Tensor, filtered: Filtered, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of scaled logits `z`, from the tokens its thresholds keep, with probability softmax(z)."""
    token_ids = torch.empty(z.shape[0], dtype=torch.long)
    in_candidates = torch.zeros(z.shape[0], dtype=torch.bool)
    for group in filtered.candidates:
        order = group.token_ids.argsort(1)
        ids = group.token_ids.gather(1, order)
        values = group.logits.gather(1, order)
        weights = torch.exp(values - row_max[group.rows, None]) * (values >= group.thresholds[:, None])
        token_ids[group.rows] = ids.gather(1, inverse_cdf(weights, uniforms[group.rows])[:, None]).squeeze(1)
        in_candidates[group.rows] = True
    rest = (~in_candidates).nonzero().squeeze(1)
    if rest.numel() == z.shape[0]:
        rows_z, rest_max, cut = z, row_max, filtered.thresholds
    else:
        rows_z, rest_max, cut = z[rest], row_max[rest], filtered.thresholds[rest]
    if rest.numel():
        if filtered.full_rows is not None and torch.equal(filtered.full_rows, rest):
            weights = mask_below(filtered.full_weights, rows_z, cut)  # type: ignore[arg-type]
        else:
            weights = kept_weights(rows_z, rest_max, cut)
        token_ids[rest] = inverse_cdf(weights, uniforms[rest])
    return token_ids
