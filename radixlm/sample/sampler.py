"""Sampler: greedy (temperature 0) and temperature sampling over a batch of logits rows."""

from __future__ import annotations

import torch

from radixlm.request import Request


class Sampler:
    """Greedy rows take the exact argmax; the others sample softmax(logits / T) from the engine's generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        token_ids = logits.argmax(dim=-1)
        sampled_rows = [i for i, r in enumerate(requests) if not r.sampling_params.is_greedy]
        if sampled_rows:
            rows = torch.tensor(sampled_rows)
            temperatures = torch.tensor([requests[i].sampling_params.temperature for i in sampled_rows])
            probs = torch.softmax(logits[rows] / temperatures[:, None], dim=-1)
            token_ids[rows] = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
        return token_ids.tolist()
