"""Repetition (HF), frequency and presence (OpenAI) penalties, and the token statistics they need.

Repetition penalty r, over prompt and output tokens: a seen token's logit z becomes z / r if z > 0, else z * r.
Frequency f and presence p, over output tokens only: z -= f * count + p * (count > 0).
"""

from __future__ import annotations

import torch

from radixlm.sample.batch import SamplingRow


class PenaltyStats:
    """Which tokens each penalty row has seen (prompt or output) and how often it generated each: dense `[P, V]`,
    plus the flat indices (`row * V + token`) of the seen and of the generated cells, so that applying the
    penalties touches only those cells instead of scanning the vocabulary.

    Kept across steps: a row whose sequence was already counted only adds the tokens it gained since (one per
    decode step); rows are carried over by sequence when the batch composition changes, so a new composition
    costs one row copy per continuing sequence plus a count of each new sequence's tokens.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._requests: list[SamplingRow] = []
        self._num_counted: list[int] = []  # tokens of each row's sequence already in the statistics
        self.seen = torch.zeros(0, vocab_size, dtype=torch.bool)
        self.output_counts = torch.zeros(0, vocab_size, dtype=torch.float32)
        self.seen_cells = torch.zeros(0, dtype=torch.long)
        self.output_cells = torch.zeros(0, dtype=torch.long)

    def update(self, requests: list[SamplingRow]) -> None:
        """Make row i describe `requests[i]`, counting every token each sequence holds now."""
        same_rows = len(requests) == len(self._requests) and all(
            a is b for a, b in zip(requests, self._requests, strict=True))
        if not same_rows:
            self._regroup(requests)
        prompt_cells: list[int] = []
        output_cells: list[int] = []
        vocab_size = self.vocab_size
        for row, request in enumerate(requests):
            start = self._num_counted[row]
            if start == request.num_tokens:
                continue
            if start < request.num_prompt_tokens:
                prompt_cells += [row * vocab_size + t for t in request.all_token_ids[start:request.num_prompt_tokens]]
                start = request.num_prompt_tokens
            output_cells += [row * vocab_size + t for t in request.all_token_ids[start:request.num_tokens]]
            self._num_counted[row] = request.num_tokens
        if prompt_cells or output_cells:
            self._add(torch.tensor(prompt_cells, dtype=torch.long), torch.tensor(output_cells, dtype=torch.long))

    def _add(self, prompt_cells: torch.Tensor, output_cells: torch.Tensor) -> None:
        seen, counts = self.seen.view(-1), self.output_counts.view(-1)
        new_output, repeats = output_cells.unique(return_counts=True)
        first_output = new_output[counts[new_output] == 0]
        counts.index_put_((new_output,), repeats.float(), accumulate=True)
        touched = torch.cat([prompt_cells, new_output]).unique()
        first_seen = touched[~seen[touched]]
        seen[first_seen] = True
        self.seen_cells = torch.cat([self.seen_cells, first_seen])
        self.output_cells = torch.cat([self.output_cells, first_output])

    def _regroup(self, requests: list[SamplingRow]) -> None:
        previous_row = {id(request): row for row, request in enumerate(self._requests)}
        sources = [previous_row.get(id(request), -1) for request in requests]
        seen = torch.zeros(len(requests), self.vocab_size, dtype=torch.bool)
        output_counts = torch.zeros(len(requests), self.vocab_size, dtype=torch.float32)
        kept = [(row, source) for row, source in enumerate(sources) if source >= 0]
        if kept:
            rows = torch.tensor([row for row, _ in kept])
            source_rows = torch.tensor([source for _, source in kept])
            seen[rows] = self.seen[source_rows]
            output_counts[rows] = self.output_counts[source_rows]
        self._num_counted = [self._num_counted[source] if source >= 0 else 0 for source in sources]
        self._requests = list(requests)  # holding them keeps their id() unique
        self.seen, self.output_counts = seen, output_counts
        self.seen_cells = seen.view(-1).nonzero().squeeze(1)
        self.output_cells = output_counts.view(-1).nonzero().squeeze(1)


def apply_penalties(logits: torch.Tensor, rows: torch.Tensor, stats: PenaltyStats, repetition: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor) -> None:
    """Penalize `logits[rows]` in place; `stats` and the penalties are indexed like `rows`."""
    vocab_size = stats.vocab_size
    if bool((repetition != 1.0).any()):
        row_index, token_ids = stats.seen_cells // vocab_size, stats.seen_cells % vocab_size
        absolute_rows = rows[row_index]
        values = logits[absolute_rows, token_ids]
        factor = repetition[row_index]
        logits[absolute_rows, token_ids] = torch.where(values > 0, values / factor, values * factor)
    if bool(((frequency != 0.0) | (presence != 0.0)).any()):
        row_index, token_ids = stats.output_cells // vocab_size, stats.output_cells % vocab_size
        counts = stats.output_counts.view(-1)[stats.output_cells]
        penalty = frequency[row_index] * counts + presence[row_index]
        logits.index_put_((rows[row_index], token_ids), -penalty, accumulate=True)
