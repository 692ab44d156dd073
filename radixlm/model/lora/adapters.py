"""LoRAAdapters: the adapters a served model holds, and where each of the base checkpoint's projections lives in it.

At start (`--enable-lora`), every attention and MLP projection of the decoder layers is wrapped in a `LoRALinear`
(after fusing and quantization, so the base keeps its format and kernels). A projection that fusing merged into
another (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`, see `radixlm.model.fused_ops`) is found at its
columns of the fused one. `target_shapes` gives the engine each original projection's name and shape, which is what
an adapter file names and is checked against (`radixlm.model.lora.adapter_file`).

`add` reads a checked adapter's tensors into the model's dtype and device and hands each LoRALinear its delta;
`remove` takes them back. `rows(groups)` marks, for the length of one forward, which rows run which adapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from safetensors.torch import load_file
from torch import nn

from radixlm.model.fused_ops import FusedGatedMLP
from radixlm.model.lora.adapter_file import AdapterFile
from radixlm.model.lora.linear import ActiveRows, DeltaPart, LoRALinear, ProjectionDelta, RowGroup

DECODER_LAYER = re.compile(r"(^|\.)layers\.\d+\.")


@dataclass(frozen=True)
class Target:
    """Where an original projection lives: the LoRALinear at `linear` (a module path), its output columns."""

    linear: str
    first_column: int
    end_column: int
    in_features: int

    @property
    def out_features(self) -> int:
        return self.end_column - self.first_column


class LoRAAdapters:
    """The adapters loaded into one model (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        self.device = next(model.parameters()).device
        self.active = ActiveRows()
        for module in model.modules():  # the adapters' gate and up deltas are laid out by halves
            if isinstance(module, FusedGatedMLP):
                module.restore_halves()
        self.targets = _find_targets(model)
        for path in sorted({target.linear for target in self.targets.values()}):
            parent_name, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, LoRALinear(getattr(parent, child), self.active))
        self.linears: dict[str, LoRALinear] = {path: model.get_submodule(path)
                                               for path in {target.linear for target in self.targets.values()}}
        self.loaded: dict[int, AdapterFile] = {}

    def target_shapes(self) -> dict[str, tuple[int, int]]:
        """Original projection name -> (in_features, out_features): what adapter files are checked against."""
        return {name: (t.in_features, t.out_features) for name, t in self.targets.items()}

    def add(self, lora_id: int, adapter: AdapterFile) -> None:
        """Load a checked adapter's weights as adapter `lora_id` (replacing one loaded under that id)."""
        tensors = load_file(adapter.weights_path)
        by_linear: dict[str, list[tuple[Target, torch.Tensor, torch.Tensor, float]]] = {}
        for module in adapter.modules:
            target = self.targets[module.name]
            lora_a = tensors[module.a_key].to(self.device, self.dtype)
            lora_b = tensors[module.b_key].to(self.device, self.dtype)
            by_linear.setdefault(target.linear, []).append((target, lora_a, lora_b, module.scaling))
        deltas = {path: _projection_delta(parts) for path, parts in by_linear.items()}
        self.remove(lora_id)
        for path, delta in deltas.items():
            self.linears[path].deltas[lora_id] = delta
        self.loaded[lora_id] = adapter

    def remove(self, lora_id: int) -> None:
        """Drop adapter `lora_id`'s weights (nothing if it is not loaded)."""
        for linear in self.linears.values():
            linear.deltas.pop(lora_id, None)
        self.loaded.pop(lora_id, None)

    @contextmanager
    def rows(self, groups: Sequence[RowGroup]) -> Iterator[None]:
        """Within the block, the LoRALinears add each group's adapter to its rows."""
        unknown = {group.lora_id for group in groups} - set(self.loaded)
        if unknown:
            raise RuntimeError(f"LoRA adapter ids {sorted(unknown)} are not loaded in the model worker")
        self.active.groups = tuple(groups)
        try:
            yield
        finally:
            self.active.groups = ()


def _is_linear(module: nn.Module) -> bool:
    return isinstance(getattr(module, "in_features", None), int) and isinstance(getattr(module, "out_features", None),
                                                                                 int)


def _find_targets(model: nn.Module) -> dict[str, Target]:
    """Every projection inside the decoder layers by its name in the base checkpoint (see the module docstring)."""
    targets: dict[str, Target] = {}
    fused: set[str] = set()
    for path, module in model.named_modules():
        if not DECODER_LAYER.search(path + "."):
            continue
        if _is_linear(getattr(module, "qkv_proj", None)) and hasattr(module, "num_kv_heads") \
                and not _is_linear(getattr(module, "q_proj", None)):  # our fused attention
            qkv = module.qkv_proj
            q_end = module.num_heads * module.head_dim
            k_end = q_end + module.num_kv_heads * module.head_dim
            for name, first, end in (("q_proj", 0, q_end), ("k_proj", q_end, k_end),
                                     ("v_proj", k_end, qkv.out_features)):
                targets[f"{path}.{name}"] = Target(f"{path}.qkv_proj", first, end, qkv.in_features)
            fused.add(f"{path}.qkv_proj")
        elif isinstance(module, FusedGatedMLP):
            gate_up = module.gate_up_proj
            half = gate_up.out_features // 2
            targets[f"{path}.gate_proj"] = Target(f"{path}.gate_up_proj", 0, half, gate_up.in_features)
            targets[f"{path}.up_proj"] = Target(f"{path}.gate_up_proj", half, gate_up.out_features,
                                                gate_up.in_features)
            fused.add(f"{path}.gate_up_proj")
    for path, module in model.named_modules():
        inside_fused = any(path.startswith(f"{name}.") for name in fused)
        if _is_linear(module) and DECODER_LAYER.search(path) and path not in fused and not inside_fused:
            targets.setdefault(path, Target(path, 0, module.out_features, module.in_features))
    return targets


def _projection_delta(parts: list[tuple[Target, torch.Tensor, torch.Tensor, float]]) -> ProjectionDelta:
    """One adapter's weights on one LoRALinear, from (target, A, B, scaling) of each projection it adapts there:
    A stacked, and per distinct scaling the Bs laid along those ranks over the columns they span."""
    parts = sorted(parts, key=lambda part: part[0].first_column)
    ranks = [0]
    for _, lora_a, _, _ in parts:
        ranks.append(ranks[-1] + lora_a.shape[0])
    stacked_a_t = torch.cat([lora_a for _, lora_a, _, _ in parts]).T.contiguous()
    delta_parts = []
    for scaling in dict.fromkeys(part[3] for part in parts):
        members = [i for i, part in enumerate(parts) if part[3] == scaling]
        first = min(parts[i][0].first_column for i in members)
        end = max(parts[i][0].end_column for i in members)
        lora_b_t = stacked_a_t.new_zeros(ranks[-1], end - first)
        for i in members:
            target, _, lora_b, _ = parts[i]
            lora_b_t[ranks[i]:ranks[i + 1], target.first_column - first:target.end_column - first] = lora_b.T
        delta_parts.append(DeltaPart(first, end, lora_b_t, scaling))
    return ProjectionDelta(stacked_a_t, tuple(delta_parts))
