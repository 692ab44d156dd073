"""LoRALinear: a projection of the base model plus the low-rank deltas of the adapters its rows run with.

One forward packs the rows of every request, base-model and adapted alike, into one batch (see
`radixlm.model.input_batch`: rows are grouped by adapter). The base projection runs once over all rows; then for
each group of rows that runs an adapter touching this projection, the adapter's delta is added to those rows:
`shrink = x_rows @ A^T` (A of every part of the projection stacked, one matmul), then per part
`y_rows[:, part columns] += (shrink[:, part ranks] @ B^T) * scaling` (Punica's shrink and expand, grouped by
adapter). A fused projection (q/k/v, gate/up) has one part per original projection the adapter targets.

Which rows run which adapter is the forward's metadata: `ActiveRows`, one object per model that every LoRALinear
reads, set around each forward by `radixlm.model.lora.adapters.LoRAAdapters.rows`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class RowGroup:
    """Rows `start .. end - 1` of the packed forward run adapter `lora_id` (>= 1)."""

    lora_id: int
    start: int
    end: int


@dataclass
class ActiveRows:
    """The adapted row groups of the forward in progress (none outside a forward)."""

    groups: tuple[RowGroup, ...] = ()


@dataclass(frozen=True)
class DeltaPart:
    """One original projection inside a (possibly fused) LoRALinear: its output columns, its slice of the stacked
    ranks, its B ([columns, rank]) and its scaling."""

    first_column: int
    end_column: int
    first_rank: int
    end_rank: int
    lora_b: torch.Tensor
    scaling: float


@dataclass(frozen=True)
class ProjectionDelta:
    """One adapter on one LoRALinear: A of its parts stacked ([sum of ranks, in_features]) and the parts."""

    lora_a: torch.Tensor
    parts: tuple[DeltaPart, ...] = field(default_factory=tuple)


class LoRALinear(nn.Module):
    """`base(x)`, plus each active adapter's delta on its rows; see the module docstring."""

    def __init__(self, base: nn.Module, active: ActiveRows) -> None:
        super().__init__()
        self.base = base
        self.active = active
        self.in_features: int = base.in_features
        self.out_features: int = base.out_features
        self.deltas: dict[int, ProjectionDelta] = {}  # lora id -> its delta (adapters leaving this one out: none)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        groups = self.active.groups
        if not groups or not self.deltas:
            return y
        rows = x.reshape(-1, self.in_features)
        out = y.view(-1, self.out_features)  # in place: the base's output is a fresh contiguous tensor
        for group in groups:
            delta = self.deltas.get(group.lora_id)
            if delta is None:
                continue
            shrunk = rows[group.start:group.end] @ delta.lora_a.T
            for part in delta.parts:
                expanded = shrunk[:, part.first_rank:part.end_rank] @ part.lora_b.T
                out[group.start:group.end, part.first_column:part.end_column].add_(expanded * part.scaling)
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, adapters={sorted(self.deltas)}"
