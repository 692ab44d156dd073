"""Bfloat16 linears whose weights oneDNN reorders once, at load, into its own blocked layout.

On the CPU, `F.linear` with bfloat16 tensors runs oneDNN (AMX-BF16 tiles where the CPU has them, AVX-512 BF16 or
a converting path elsewhere) but reorders the plain `[out, in]` weight into oneDNN's layout on every call. Reordered
once (`torch.ops.mkldnn._reorder_linear_weight`, what inductor's CPU weight-packing pass uses) and called through
`torch.ops.mkldnn._linear_pointwise`, the same products run without that copy: measured 1.2-2.4x faster per call on
a Xeon with AMX (2 threads; the default model's and a 1B model's shapes at 1, 32 and 256 rows), with results equal
to `F.linear`'s in every case checked (tests/unit/test_prepacked_linear.py).

The reordered weight replaces the plain one (no second copy), except for an LM head tied to the input embedding,
which keeps `F.linear`: the embedding still reads the plain weight, and a reordered copy would add the whole
vocabulary matrix. On a CPU with AMX-BF16 or AVX-512 BF16, `use_prepacked_linears` gives the linears one of
radixlm's own row kernels instead (`radixlm.model.bf16_linear`: faster at a decode step's few rows, oneDNN's matmul
on the plain weight above), a tied head included; this layout serves CPUs with neither.
`--attention-backend torch` (the all-PyTorch reference) keeps `F.linear` everywhere.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from radixlm.model.bf16_linear import DOT, PACKED, Bf16Linear, DotPackedLinear, available_kernel, fits
from radixlm.model.huge_pages import HugePageArena, move_parameters


def prepacking_available() -> bool:
    """oneDNN is built into this PyTorch, enabled, and takes bfloat16 on this CPU (its reorder refuses CPUs without
    AVX-512 BW/VL/DQ or AVX-NE-CONVERT, such as an AVX2-only Zen 3: there `F.linear` keeps its converting path)."""
    return (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PrepackedLinear(nn.Module):
    """`y = x W^T + b` for bfloat16 CPU tensors, W held in oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
            raise ValueError(f"prepacking takes a bfloat16 CPU weight, got {weight.dtype} on {weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias
        # A plain attribute, not a parameter: an opaque oneDNN tensor, never saved, moved or trained.
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)

    @property
    def weight_bytes(self) -> int:
        """The bytes of the weight one forward reads (the reordered copy holds the same bfloat16 values)."""
        return self.in_features * self.out_features * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.bfloat16 or not rows.is_contiguous():
            rows = rows.to(torch.bfloat16).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self._packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


_AUTO = "auto"


def use_prepacked_linears(model: nn.Module, kernel: str | None = _AUTO) -> int:
    """Replace every bfloat16 CPU `nn.Linear` of `model` by one on our kernel `kernel` (`radixlm.model.bf16_linear`;
    "auto": the one this CPU runs best, if any) where the shape fits: a `DotPackedLinear` for PACKED, a head tied to
    the input embedding there a `Bf16Linear` on DOT (the plain weight, shared as before); a `Bf16Linear` for AMX or
    DOT, a tied head included. Else (or with `kernel` None) by a `PrepackedLinear`, but a tied head, which keeps
    `F.linear`. The weights our kernels stream go onto huge pages (the packed ones as they are packed, the plain ones
    after: `move_parameters`, a tied embedding with its head): the default model's bfloat16 decode at batch 1, the
    packed weights alternated in one process, 15.57 against 14.88 ms a token (faster in 11 of 12 pairs; Zen 4,
    2026-12-05). Returns how many were replaced."""
    kernel = available_kernel() if kernel == _AUTO else kernel
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = getattr(embedding, "weight", None)
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16
               and module.weight.device.type == "cpu"]
    replaced = 0
    arena = HugePageArena()
    for name, linear in targets:
        own = DOT if kernel == PACKED and linear.weight is tied else kernel
        fast = own is not None and fits(linear.out_features, linear.in_features, own)
        if linear.weight is tied and not fast:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        replacement = (DotPackedLinear(linear, arena) if own == PACKED else Bf16Linear(linear, own)) if fast \
            else PrepackedLinear(linear)
        setattr(parent, child, replacement)
        replaced += 1
    # The replaced linears: without them, a plain weight goes as soon as its copy is placed (but the last linear's
    # and the tied embedding's, which the locals hold until the end).
    del targets
    plain_weights = (module.weight for module in model.modules()
                     if isinstance(module, Bf16Linear) and not isinstance(module.weight, DTensor))
    move_parameters(model, plain_weights, arena)
    return replaced
