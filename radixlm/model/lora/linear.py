"""LoRALinear: a projection of the base model plus the low-rank deltas of the adapters its rows run with.

One forward packs the rows of every request, base-model and adapted alike, into one batch (see
`radixlm.model.input_batch`: rows are grouped by adapter). The base projection runs once over all rows; then for
each group of rows that runs an adapter touching this projection, the adapter's delta is added to those rows:
`shrink = x_rows @ A^T` (one matmul), then `y_rows += scaling * (shrink @ B^T)` (one more, in place: Punica's
shrink and expand, grouped by
adapter). A fused projection (q/k/v, gate/up) stacks the A of every original projection the adapter targets, and
lays their Bs side by side (zero elsewhere), so one adapter costs two matmuls per projection whatever it adapts.

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
    """Adapter weights over output columns `first_column .. end_column - 1` of a (possibly fused) LoRALinear: the
    transposed B of every original projection there, side by side along the ranks of the stacked A and zero where a
    projection does not reach (`[sum of ranks, columns]`), and the scaling they share."""

    first_column: int
    end_column: int
    lora_b_t: torch.Tensor
    scaling: float


@dataclass(frozen=True)
class ProjectionDelta:
    """One adapter on one LoRALinear: A of its projections stacked and transposed (`[in_features, sum of ranks]`),
    and one part per scaling (one part, unless the adapter's rank or alpha patterns differ between the projections
    a fused linear holds)."""

    lora_a_t: torch.Tensor
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
            shrunk = torch.mm(rows[group.start:group.end], delta.lora_a_t)
            for part in delta.parts:  # out += scaling * (shrunk @ B^T), as PEFT adds `lora_B(lora_A(x)) * scaling`
                out[group.start:group.end, part.first_column:part.end_column].addmm_(shrunk, part.lora_b_t,
                                                                                     alpha=part.scaling)
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, adapters={sorted(self.deltas)}"
