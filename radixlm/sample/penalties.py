"""Repetition (HF), frequency and presence (OpenAI) penalties, and the token statistics they need.

Repetition penalty r, over prompt and output tokens: a seen token's logit z becomes z / r if z > 0, else z * r.
Frequency f and presence p, over output tokens only: z -= f * count + p * (count > 0).
"""

from __future__ import annotations

import torch

from radixlm.request import Request


class PenaltyStats:
    """Which tokens each penalty row's prompt holds and how often each token was generated: dense `[P, vocab]`.

    Kept across steps: a row whose sequence was already counted only adds the tokens it gained since (one per
    decode step); rows are carried over by sequence when the batch composition changes, so a new composition
    costs one row copy per continuing sequence plus a count of each new sequence's tokens.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._requests: list[Request] = []
        self._num_counted: list[int] = []  # tokens of each row's sequence already in the statistics
        self.in_prompt = torch.zeros(0, vocab_size, dtype=torch.bool)
        self.output_counts = torch.zeros(0, vocab_size, dtype=torch.float32)

    def update(self, requests: list[Request]) -> None:
        """Make row i describe `requests[i]`, counting every token each sequence holds now."""
        same_rows = len(requests) == len(self._requests) and all(
            a is b for a, b in zip(requests, self._requests, strict=True))
        if not same_rows:
            self._regroup(requests)
        prompt_rows, prompt_ids, output_rows, output_ids = [], [], [], []
        for row, request in enumerate(requests):
            start = self._num_counted[row]
            if start == request.num_tokens:
                continue
            if start < request.num_prompt_tokens:
                new_prompt = request.all_token_ids[start:request.num_prompt_tokens]
                prompt_rows += [row] * len(new_prompt)
                prompt_ids += new_prompt
                start = request.num_prompt_tokens
            new_output = request.all_token_ids[start:request.num_tokens]
            output_rows += [row] * len(new_output)
            output_ids += new_output
            self._num_counted[row] = request.num_tokens
        if prompt_ids:
            self.in_prompt[torch.tensor(prompt_rows), torch.tensor(prompt_ids)] = True
        if output_ids:
            self.output_counts.index_put_((torch.tensor(output_rows), torch.tensor(output_ids)),
                                          torch.ones(len(output_ids)), accumulate=True)

    def _regroup(self, requests: list[Request]) -> None:
        previous_row = {id(request): row for row, request in enumerate(self._requests)}
        sources = [previous_row.get(id(request), -1) for request in requests]
        in_prompt = torch.zeros(len(requests), self.vocab_size, dtype=torch.bool)
        output_counts = torch.zeros(len(requests), self.vocab_size, dtype=torch.float32)
        kept = [(row, source) for row, source in enumerate(sources) if source >= 0]
        if kept:
            rows = torch.tensor([row for row, _ in kept])
            source_rows = torch.tensor([source for _, source in kept])
            in_prompt[rows] = self.in_prompt[source_rows]
            output_counts[rows] = self.output_counts[source_rows]
        self._num_counted = [self._num_counted[source] if source >= 0 else 0 for source in sources]
        self._requests = list(requests)  # holding them keeps their id() unique
        self.in_prompt, self.output_counts = in_prompt, output_counts


def apply_penalties(logits: torch.Tensor, rows: torch.Tensor, in_prompt: torch.Tensor, output_counts: torch.Tensor,
                    repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor) -> None:
    """Penalize `logits[rows]` in place; statistics and penalties are indexed like `rows`.

    Only the (row, token) pairs that were seen are touched, found with one `nonzero` per kind: the seen sets are a
    few hundred tokens per row while a dense pass would go over the whole vocabulary several times.
    """
    if bool((repetition != 1.0).any()):
        seen = in_prompt | (output_counts > 0)
        seen &= (repetition != 1.0)[:, None]
        row_index, token_ids = seen.nonzero(as_tuple=True)
        absolute_rows = rows[row_index]
        values = logits[absolute_rows, token_ids]
        factor = repetition[row_index]
        logits[absolute_rows, token_ids] = torch.where(values > 0, values / factor, values * factor)
    if bool(((frequency != 0.0) | (presence != 0.0)).any()):
        row_index, token_ids = output_counts.nonzero(as_tuple=True)
        counts = output_counts[row_index, token_ids]
        penalty = frequency[row_index] * counts + presence[row_index]
        logits.index_put_((rows[row_index], token_ids), -penalty, accumulate=True)
