"""Logprobs of the raw model distribution (vLLM semantics): before logit_bias, penalties, temperature or filters.

For each position: the logprob and rank (1 = most likely; 1 + the number of strictly more likely tokens) of the
token that was chosen (sampled, or the next prompt token), and the `num_top` most likely tokens with theirs.
"""

from __future__ import annotations

import torch

from radixlm.core.step import TokenLogprobs


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]) -> list[TokenLogprobs]:
    """For rows of log-softmaxed logits `[N, V]`, the chosen `token_ids` ([N]) and `num_top[i]` alternatives."""
    if logprobs.shape[0] == 0:
        return []
    chosen = logprobs.gather(1, token_ids[:, None])
    top_values, top_ids = logprobs.topk(max(1, *num_top), dim=1)
    # A chosen token at least as likely as the last of the top ones has every more likely token among them; the
    # others need a count over their row.
    ranks = (top_values > chosen).sum(1) + 1
    outside = chosen.squeeze(1) < top_values[:, -1]
    if bool(outside.any()):
        ranks[outside] = (logprobs[outside] > chosen[outside]).sum(1) + 1
    rows = zip(token_ids.tolist(), chosen.squeeze(1).tolist(), ranks.tolist(), top_ids.tolist(),
               top_values.tolist(), num_top, strict=True)
    return [TokenLogprobs(token_id, logprob, rank, ids[:n], values[:n])
            for token_id, logprob, rank, ids, values, n in rows]


def prompt_logprobs(logits: torch.Tensor, next_token_ids: list[int], num_top: int) -> list[TokenLogprobs]:
    """Prompt logprobs: row i of `logits` is the position before prompt token `next_token_ids[i]`."""
    logprobs = torch.log_softmax(logits.float(), dim=1)
    return gather_logprobs(logprobs, torch.tensor(next_token_ids, dtype=torch.long), [num_top] * len(next_token_ids))
