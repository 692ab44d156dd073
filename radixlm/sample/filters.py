"""min_p -> top-k -> top-p as one threshold per row: a row keeps exactly the tokens whose scaled logit z is >= it.

Each filter keeps the most likely tokens, so each is a cut on z, and the three in sequence are the highest cut:
- min_p keeps p >= min_p * p_max, that is z >= max(z) + ln(min_p);
- top-k keeps z >= the k-th largest z: ties with the k-th token are kept, so the result never depends on an order
  among equal logits;
- top-p renormalises what is left and keeps a token when the tokens strictly more likely than it hold less than
  p of the mass: the token that crosses p is kept, and so are its ties.

Finding the top-k / top-p cut needs the tokens in order of z, and a full sort of a [64, 49152] batch costs more
than a tenth of a forward on CPU. So candidates come from `topk` with a growing size (64, then 1024, then the
vocabulary): a row is done as soon as its last candidate falls below its cut, since then every kept token is a
candidate. Peaked model distributions finish at 64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CANDIDATE_SIZES = (64, 1024)


@dataclass
class Candidates:
    """Rows (indices into the filtered batch) whose kept tokens all lie among their `token_ids` ([C, K])."""

    rows: torch.Tensor
    token_ids: torch.Tensor
    logits: torch.Tensor  # [C, K] their z, largest first
    thresholds: torch.Tensor  # [C]


@dataclass
class Filtered:
    """`thresholds[i]`: row i keeps z >= it. Rows in no `Candidates` group are sampled over the whole vocabulary."""

    thresholds: torch.Tensor
    candidates: list[Candidates]


def filter_thresholds(z: torch.Tensor, row_max: torch.Tensor, min_p_logs: torch.Tensor, top_ks: torch.Tensor,
                      top_ps: torch.Tensor, candidate_sizes: tuple[int, ...] = CANDIDATE_SIZES) -> Filtered:
    """Thresholds of min_p (given as ln(min_p), -inf for off), top-k (0 = off) and top-p (1 = off) for rows `z`."""
    vocab_size = z.shape[1]
    thresholds = row_max + min_p_logs
    pending = ((top_ks > 0) | (top_ps < 1.0)).nonzero().squeeze(1)
    groups = []
    for size in (*candidate_sizes, vocab_size):
        if pending.numel() == 0:
            break
        num_candidates = min(vocab_size, max(size, int(top_ks[pending].max())))
        rows_z = z[pending]
        values, token_ids = rows_z.topk(num_candidates, dim=1)
        cut, done = _cut(rows_z, values, row_max[pending], thresholds[pending], top_ks[pending], top_ps[pending],
                         whole_vocab=num_candidates == vocab_size)
        finished = pending[done]
        thresholds[finished] = cut[done]
        groups.append(Candidates(finished, token_ids[done], values[done], cut[done]))
        pending = pending[~done]
    return Filtered(thresholds, groups)


def _cut(rows_z: torch.Tensor, values: torch.Tensor, row_max: torch.Tensor, min_p_cut: torch.Tensor,
         top_ks: torch.Tensor, top_ps: torch.Tensor, whole_vocab: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The cut of rows whose `values` are their largest logits (descending), and which rows it is final for."""
    num_candidates = values.shape[1]
    kth = values.gather(1, (top_ks.clamp(1, num_candidates) - 1)[:, None]).squeeze(1)
    cut = torch.where(top_ks > 0, torch.maximum(min_p_cut, kth), min_p_cut)
    weights = torch.exp(values - row_max[:, None]) * (values >= cut[:, None])
    total = weights.sum(1)
    outside = ~(values[:, -1] < cut) if not whole_vocab else torch.zeros_like(cut, dtype=torch.bool)
    if bool(outside.any()):  # some kept tokens are not candidates: the mass to renormalise by needs the full row
        rest = rows_z[outside]
        total[outside] = (torch.exp(rest - row_max[outside, None]) * (rest >= cut[outside, None])).sum(1)
    probs = weights / total[:, None]
    mass_before = probs.cumsum(1) - probs
    kept = (mass_before < top_ps[:, None]) & (values >= cut[:, None])  # a prefix: both parts are
    last_kept = values.gather(1, (kept.sum(1).clamp(min=1) - 1)[:, None]).squeeze(1)
    cut = torch.where(top_ps < 1.0, torch.maximum(cut, last_kept), cut)
    done = torch.ones_like(cut, dtype=torch.bool) if whole_vocab else values[:, -1] < cut
    return cut, done
