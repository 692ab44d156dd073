"""min_p -> top-k -> top-p as one threshold per row: a row keeps exactly the tokens whose scaled logit z is >= it.

Each filter keeps the most likely tokens, so each is a cut on z, and the three in sequence are the highest cut:
- min_p keeps p >= min_p * p_max, that is z >= max(z) + ln(min_p);
- top-k keeps z >= the k-th largest z: ties with the k-th token are kept, so the result never depends on an order
  among equal logits;
- top-p renormalises what is left and keeps a token when the tokens strictly more likely than it hold less than
  p of the mass: the token that crosses p is kept, and so are its ties.

Finding the top-k / top-p cut needs the tokens in order of z, and a full sort of a [64, 49152] batch costs about
half a forward on CPU. So the rows first get their 64 most likely tokens (`topk`): a row is done when its last
candidate falls below its cut, since then every kept token is a candidate; peaked distributions and top-k rows
finish there. A row whose nucleus is wider gets its top-p cut from a histogram of its probability mass over logit
buckets: only the tokens of the bucket where the mass above reaches p are sorted (`nucleus_cut`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_CANDIDATES = 64
NUM_BUCKETS = 4096
BUCKETS_PER_UNIT = 128  # the buckets cover 32 units of z below the row's max; everything lower shares the last


@dataclass
class Candidates:
    """Rows (indices into the filtered batch) whose kept tokens all lie among their `token_ids` ([C, K])."""

    rows: torch.Tensor
    token_ids: torch.Tensor
    logits: torch.Tensor  # [C, K] their z, largest first
    thresholds: torch.Tensor  # [C]


@dataclass
class Filtered:
    """`thresholds[i]`: row i keeps z >= it. Rows in no `Candidates` group are sampled over the whole vocabulary;
    `full_weights` are `kept_weights` of the rows `full_rows` (masked by a lower cut) when the filters already
    computed them, for the draw to reuse."""

    thresholds: torch.Tensor
    candidates: list[Candidates]
    full_rows: torch.Tensor | None = None
    full_weights: torch.Tensor | None = None


def filter_thresholds(z: torch.Tensor, row_max: torch.Tensor, min_p_logs: torch.Tensor, top_ks: torch.Tensor,
                      top_ps: torch.Tensor, num_candidates: int = NUM_CANDIDATES) -> Filtered:
    """Thresholds of min_p (given as ln(min_p), -inf for off), top-k (0 = off) and top-p (1 = off) for rows `z`.

    Each row's max must be finite and within `finite.LOGIT_LIMIT` (the sampler cleans rows that are not): then no
    difference of logits overflows and every index computed here is in range.
    """
    vocab_size = z.shape[1]
    thresholds = row_max + min_p_logs
    pending = ((top_ks > 0) | (top_ps < 1.0)).nonzero().squeeze(1)
    if pending.numel() == 0:
        return Filtered(thresholds, [])
    rows_z = z if pending.numel() == z.shape[0] else z[pending]  # (all rows pending: pending == arange)
    size = min(vocab_size, max(num_candidates, 1, int(top_ks[pending].max())))
    values, token_ids = rows_z.topk(size, dim=1)
    row_max, top_ps = row_max[pending], top_ps[pending]
    base_cut = _top_k_cut(values, thresholds[pending], top_ks[pending])
    # Rows whose tokens above the min_p / top-k cut are not all candidates renormalise over their full row.
    outside = ((values[:, -1] >= base_cut) & (top_ps < 1.0) if size < vocab_size
               else torch.zeros_like(top_ps, dtype=torch.bool))
    full_weights = None
    totals = torch.zeros_like(top_ps)
    if bool(outside.any()):
        full_weights = kept_weights(_take(rows_z, outside), row_max[outside], base_cut[outside])
        totals[outside] = full_weights.sum(1)
    cut = _top_p_cut_among(values, row_max, base_cut, top_ps, totals, outside)
    done = (values[:, -1] < cut) if size < vocab_size else torch.ones_like(outside)
    groups = [Candidates(pending[done], token_ids[done], values[done], cut[done])] if bool(done.any()) else []
    # Not done: top-k's cut is exact whatever the candidates; top-p needs the histogram (those rows are outside).
    # (Rows with top_p off already have cut == base_cut from `_top_p_cut_among`.)
    wide = ~done & (top_ps < 1.0)
    any_wide = bool(wide.any())
    if any_wide:
        assert full_weights is not None
        full_weights = _take(full_weights, wide[outside])
        cut[wide] = nucleus_cut(_take(rows_z, wide), row_max[wide], base_cut[wide], top_ps[wide], full_weights)
    thresholds[pending] = cut
    return Filtered(thresholds, groups, pending[wide], full_weights) if any_wide else Filtered(thresholds, groups)


def _take(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`rows[mask]` without copying when the mask keeps every row."""
    return rows if bool(mask.all()) else rows[mask]


def kept_weights(rows_z: torch.Tensor, row_max: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """exp(z - max) where z >= cut, else 0: unnormalised probabilities of the kept tokens."""
    return mask_below(torch.exp(rows_z - row_max[:, None]), rows_z, cut)


def mask_below(weights: torch.Tensor, rows_z: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """Zero `weights` (in place) where z < cut."""
    if bool((cut > float("-inf")).any()):
        weights.mul_(rows_z >= cut[:, None])  # in place: multiplying by a bool tensor out of place is far slower
    return weights


def _top_k_cut(values: torch.Tensor, min_p_cut: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    kth = values.gather(1, (top_ks.clamp(1, values.shape[1]) - 1)[:, None]).squeeze(1)
    return torch.where(top_ks > 0, torch.maximum(min_p_cut, kth), min_p_cut)


def _top_p_cut_among(values: torch.Tensor, row_max: torch.Tensor, cut: torch.Tensor, top_ps: torch.Tensor,
                     totals: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    """The top-p cut if the nucleus ends among the candidates `values` (largest first); else <= values[:, -1].

    `totals[outside]` is the kept mass of the rows whose kept tokens go beyond the candidates.
    """
    weights = torch.exp(values - row_max[:, None]) * (values >= cut[:, None])
    total = torch.where(outside, totals, weights.sum(1))
    probs = weights / total[:, None]
    kept = (probs.cumsum(1) - probs < top_ps[:, None]) & (values >= cut[:, None])  # a prefix: both parts are
    last_kept = values.gather(1, (kept.sum(1).clamp(min=1) - 1)[:, None]).squeeze(1)
    return torch.where(top_ps < 1.0, torch.maximum(cut, last_kept), cut)


def nucleus_cut(rows_z: torch.Tensor, row_max: torch.Tensor, cut: torch.Tensor, top_ps: torch.Tensor,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """The exact top-p cut over the tokens with z >= `cut`, without sorting whole rows (`weights`: their
    `kept_weights`, if already computed)."""
    weights = kept_weights(rows_z, row_max, cut) if weights is None else weights
    target = top_ps * weights.sum(1)
    # (max - z) * scale in one pass; scaling by a power of two is exact, so the row's max lands in bucket 0.
    buckets = torch.add(row_max[:, None] * BUCKETS_PER_UNIT, rows_z, alpha=-BUCKETS_PER_UNIT)
    buckets = buckets.clamp_(0, NUM_BUCKETS - 1).long()
    mass = torch.zeros(rows_z.shape[0], NUM_BUCKETS).scatter_add_(1, buckets, weights)
    mass_above_bucket = mass.cumsum(1) - mass
    crossing = ((mass_above_bucket + mass) < target[:, None]).sum(1).clamp_(max=NUM_BUCKETS - 1)
    rows, columns = (buckets == crossing[:, None]).nonzero(as_tuple=True)
    values, masses = rows_z[rows, columns], weights[rows, columns]
    order = values.argsort(descending=True, stable=True)
    order = order[rows[order].argsort(stable=True)]  # by row, then by z descending
    rows, values, masses = rows[order], values[order], masses[order]
    mass_before = masses.cumsum(0) - masses
    mass_before -= mass_before[torch.searchsorted(rows, rows)]  # restart at each row's first token
    mass_above = mass_above_bucket.gather(1, crossing[:, None]).squeeze(1)[rows] + mass_before
    kept = (mass_above < target[rows]) & (masses > 0)
    last_kept = torch.full_like(cut, float("inf")).scatter_reduce_(0, rows[kept], values[kept], "amin")
    return torch.maximum(cut, torch.where(torch.isinf(last_kept), row_max, last_kept))
