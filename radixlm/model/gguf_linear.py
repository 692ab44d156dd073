"""Linear layers and embeddings whose weights stay in a GGUF file's own blocks (`--quantization gguf`).

A GGUF checkpoint stores each weight matrix as rows of fixed-size blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, ...). These
modules keep those bytes as they are, so a 4-bit model takes its 4-bit size in memory and a decode step reads 4-bit
weights, and compute in float32:

- up to `GGUF_MAX_ROWS` rows (decode), radixlm._C's `gguf_linear` unpacks each block in registers once and
  multiplies it with every row (csrc/linear_gguf.cpp);
- above that (prefill chunks), slices of `WEIGHT_SLICE_FLOATS` weights are dequantized in turn
  (`radixlm.model.gguf_blocks.dequantize`, pure PyTorch) and multiplied by PyTorch's float32 GEMM, so no whole
  float32 copy of a matrix is ever held.

Both compute `x @ dequantize(W).T (+ bias)`: they differ only in float summation order, and the pure-PyTorch path
is the reference the kernel is tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.decode_kernel import direct_kernel, extension_error
from radixlm.model.gguf_blocks import BLOCK_FORMATS, GGUF_MAX_ROWS, dequantize, row_bytes

WEIGHT_SLICE_FLOATS = 1 << 22  # 16 MiB of float32 weights per dequantized slice (prefill path)


def gguf_kernel() -> Callable[..., torch.Tensor] | None:
    """radixlm._C's `gguf_linear` when the extension is built (or one without it: None, the PyTorch path)."""
    if extension_error() is not None:
        return None
    return direct_kernel("gguf_linear")


@dataclass(frozen=True)
class WeightBlocks:
    """Rows of one GGUF tensor: `blocks` uint8 [out_features, row_bytes] of type `ggml_type`."""
    ggml_type: int
    blocks: torch.Tensor

    @property
    def out_features(self) -> int:
        return self.blocks.shape[0]


def check_blocks(ggml_type: int, blocks: torch.Tensor, in_features: int) -> None:
    """ValueError unless `blocks` is a uint8 [N, row_bytes] tensor of a supported type for `in_features`."""
    if ggml_type not in BLOCK_FORMATS:
        raise ValueError(f"GGUF block type {ggml_type} is not served packed")
    expected = row_bytes(ggml_type, in_features)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != expected:
        raise ValueError(f"GGUF blocks must be uint8 [N, {expected}] for {BLOCK_FORMATS[ggml_type].name} "
                         f"with {in_features} input features, got {blocks.dtype} {list(blocks.shape)}")


class GGUFLinear(nn.Module):
    """`y = x W^T + b` with W held as one or more parts of GGUF blocks (stacked along the output features: a fused
    q/k/v or gate/up projection whose parts have different block types); float32 in and out."""

    def __init__(self, parts: Sequence[WeightBlocks], in_features: int, bias: torch.Tensor | None = None,
                 kernel: Callable[..., torch.Tensor] | None = None) -> None:
        """`kernel`: radixlm._C's `gguf_linear` (see `gguf_kernel`), or None for the
        pure-PyTorch path at every size."""
        super().__init__()
        if not parts:
            raise ValueError("a GGUF linear needs at least one part")
        for part in parts:
            check_blocks(part.ggml_type, part.blocks, in_features)
        self.in_features = in_features
        self.parts = _merge_adjacent(parts)
        self.out_features = sum(part.out_features for part in self.parts)
        if bias is not None and bias.shape != (self.out_features,):
            raise ValueError(f"bias must have shape [{self.out_features}], got {list(bias.shape)}")
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._kernel = kernel
        # Plain attributes, not buffers: the blocks are CPU-only (the kernel's) and never saved.
        self.weight_bytes = sum(part.blocks.numel() for part in self.parts)

    @classmethod
    def concat(cls, linears: Sequence[GGUFLinear]) -> GGUFLinear:
        """One layer computing `linears`' outputs side by side (shares their blocks when each has one part)."""
        in_features = linears[0].in_features
        if any(linear.in_features != in_features for linear in linears):
            raise ValueError("concatenated GGUF linears must share in_features")
        biases = [linear.bias for linear in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b if b is not None else torch.zeros(linear.out_features)
                              for b, linear in zip(biases, linears, strict=True)])
        parts = [part for linear in linears for part in linear.parts]
        return cls(parts, in_features, bias, linears[0]._kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self._kernel is not None and rows.shape[0] <= GGUF_MAX_ROWS and x.dtype == torch.float32:
            rows = rows.contiguous()
            if len(self.parts) == 1:
                out = self._kernel(rows, self.parts[0].blocks, self.parts[0].ggml_type, self.bias)
            else:
                out = torch.cat([self._kernel(rows, p.blocks, p.ggml_type, None) for p in self.parts], dim=1)
                if self.bias is not None:
                    out += self.bias
        else:
            out = self.reference_forward(rows)
        return out.reshape(*x.shape[:-1], self.out_features)

    def reference_forward(self, rows: torch.Tensor) -> torch.Tensor:
        """The pure-PyTorch path: dequantize slices of the weight and multiply, one slice at a time."""
        slice_rows = max(1, WEIGHT_SLICE_FLOATS // self.in_features)
        outputs = []
        for part in self.parts:
            for start in range(0, part.out_features, slice_rows):
                weight = dequantize(part.blocks[start:start + slice_rows], part.ggml_type, self.in_features)
                outputs.append(F.linear(rows.float(), weight))
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        if self.bias is not None:
            out += self.bias
        return out

    def extra_repr(self) -> str:
        kinds = "+".join(BLOCK_FORMATS[part.ggml_type].name for part in self.parts)
        return (f"in_features={self.in_features}, out_features={self.out_features}, blocks={kinds}, "
                f"bias={self.bias is not None}")


def _merge_adjacent(parts: Sequence[WeightBlocks]) -> list[WeightBlocks]:
    """Neighbouring parts of one block type become one (their rows concatenated): one kernel call instead of two."""
    merged: list[list[WeightBlocks]] = []
    for part in parts:
        if merged and merged[-1][0].ggml_type == part.ggml_type:
            merged[-1].append(part)
        else:
            merged.append([part])
    return [group[0] if len(group) == 1 else WeightBlocks(group[0].ggml_type, torch.cat([p.blocks for p in group]))
            for group in merged]


class GGUFEmbedding(nn.Module):
    """An embedding table kept in GGUF blocks: only the looked-up rows are dequantized (to `dtype`)."""

    def __init__(self, weight: WeightBlocks, embedding_dim: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        check_blocks(weight.ggml_type, weight.blocks, embedding_dim)
        self.weight_blocks = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, embedding_dim
        self.dtype = dtype
        self.weight_bytes = weight.blocks.numel()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight_blocks.blocks[input_ids.reshape(-1)]
        values = dequantize(rows, self.weight_blocks.ggml_type, self.embedding_dim).to(self.dtype)
        return values.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"blocks={BLOCK_FORMATS[self.weight_blocks.ggml_type].name}")
