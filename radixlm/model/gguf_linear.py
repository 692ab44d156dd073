"""Linear layers and embeddings whose weights stay in a GGUF file's own blocks (`--quantization gguf`).

A GGUF checkpoint stores each weight matrix as rows of fixed-size blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K). These
modules keep those bits, so a 4-bit model takes its 4-bit size in memory and a decode step reads 4-bit weights:

- with radixlm._C built, a weight is regrouped once into the kernel's tiles (`radixlm.model.gguf_tiles`, the same
  bits in another order; its `gguf_pack_tiles` writes them) and `gguf_linear` multiplies int8 activations
  (quantized per 32 values) by it at every row count, decode and prefill alike (csrc/linear/linear_gguf.cpp);
  except that on a CPU with AMX, bfloat16 calls of `AMX_MIN_ROWS` rows or more (prefill chunks, the decode rows
  that share a step with one, decode steps of 20 rows or more) take its AMX path: the rows as they are, times the
  weight dequantized to bfloat16 on the tiles (csrc/linear/gguf_amx.cpp), 1.2-3.7x the int8 kernel's rate at
  20-1,024 rows of a 1B Q4_K_M file;
- without it, the weight stays in the file's rows and the same product is computed in PyTorch:
  `F.linear(quantize_activations(x), dequantize(W))`, one slice of the weight at a time (the reference the kernel
  is tested against).

A row's output does not depend on the rows it shares a forward with, except through that choice of path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.bf16_linear import amx_available
from radixlm.model.gguf_blocks import BLOCK_FORMATS, dequantize, row_bytes
from radixlm.model.gguf_tiles import num_tiles, quantize_activations, tile_bytes
from radixlm.model.huge_pages import HugePageArena
from radixlm.model.ops import direct_kernel, extension_error

# Path ids of radixlm._C.gguf_linear's last argument (radixlm._C.gguf_linear_paths() lists what the CPU runs).
PATH_BEST, PATH_PORTABLE, PATH_AVX2, PATH_AVX512, PATH_AMX = 0, 1, 2, 3, 4
# The fewest bfloat16 rows a call runs on the AMX path (the weight dequantized once a call, so it pays with many rows):
# against the int8 kernel on a 1B Q4_K_M file's Q4_K / Q6_K weights (a Xeon with AMX, 2 threads, each path in turn
# in one process) at 8 rows 0.52x / 0.56x, at 16 1.00x / 1.08x, at 17 1.00-1.06x / 1.07x, at 20 1.13-1.16x / 1.17-1.20x,
# at 24 1.39x / 1.35x, at 256 3.2x / 3.1x.
AMX_MIN_ROWS = 20
WEIGHT_SLICE_FLOATS = 1 << 22  # 16 MiB of float32 weights per dequantized slice (the PyTorch path)
MAX_PARTS = 8  # parts of one fused linear (csrc/linear/linear_gguf.cpp's kMaxParts)


@dataclass(frozen=True)
class GGUFKernels:
    """radixlm._C's direct entry points for GGUF weights."""
    linear: Callable[..., torch.Tensor]
    rows: Callable[..., torch.Tensor]


def gguf_kernels() -> GGUFKernels | None:
    """The C++ kernels when the extension is built, else None (the PyTorch path)."""
    if extension_error() is not None:
        return None
    return GGUFKernels(direct_kernel("gguf_linear"), direct_kernel("gguf_rows"))


@dataclass(frozen=True)
class WeightPart:
    """One GGUF weight [out_features, in_features] of type `ggml_type`: `tiles` (the kernel's layout, uint8
    [num_tiles, tile_bytes]) or `rows` (the file's, uint8 [out_features, row_bytes]), whichever the path reads."""
    ggml_type: int
    out_features: int
    in_features: int
    tiles: torch.Tensor | None = None
    rows: torch.Tensor | None = None

    @classmethod
    def from_rows(cls, ggml_type: int, rows: torch.Tensor, in_features: int, packed: bool,
                  arena: HugePageArena | None = None) -> WeightPart:
        """`rows` as read from the file; `packed`: regrouped into tiles (and the rows dropped), placed in `arena`
        when one is given (a decode step streams them faster from huge pages)."""
        expected = row_bytes(ggml_type, in_features)
        if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != expected:
            raise ValueError(f"GGUF blocks must be uint8 [N, {expected}] for {BLOCK_FORMATS[ggml_type].name} "
                             f"with {in_features} input features, got {rows.dtype} {list(rows.shape)}")
        if packed:
            return cls(ggml_type, rows.shape[0], in_features, tiles=_packed_tiles(rows, ggml_type, in_features, arena))
        return cls(ggml_type, rows.shape[0], in_features, rows=rows.contiguous())

    @property
    def num_bytes(self) -> int:
        return (self.tiles if self.tiles is not None else self.rows).numel()

    def dequantized_rows(self, start: int, stop: int, kernels: GGUFKernels | None) -> torch.Tensor:
        """float32 weights of rows [start, stop), equal to `gguf_blocks.dequantize` of them."""
        if self.rows is not None:
            return dequantize(self.rows[start:stop], self.ggml_type, self.in_features)
        if kernels is None:
            raise RuntimeError("tiled GGUF weights need radixlm._C to be read")
        ids = torch.arange(start, stop, dtype=torch.long)
        return kernels.rows(self.tiles, self.ggml_type, self.in_features, self.out_features, ids)

    def check(self) -> None:
        if self.tiles is not None:
            expected = (num_tiles(self.out_features), tile_bytes(self.ggml_type, self.in_features))
            if self.tiles.dtype != torch.uint8 or tuple(self.tiles.shape) != expected:
                raise ValueError(f"tiles must be uint8 {list(expected)}, got {self.tiles.dtype} "
                                 f"{list(self.tiles.shape)}")


def _packed_tiles(rows: torch.Tensor, ggml_type: int, in_features: int,
                  arena: HugePageArena | None) -> torch.Tensor:
    """The tiles of a weight's rows, in `arena` when one is given, written there directly by radixlm._C's
    `gguf_pack_tiles`: the bytes of `gguf_tiles.pack_tiles` (the PyTorch reference it is tested against) in a tenth of
    its time. Tiles are the extension's layout: without it a weight stays in rows."""
    error = extension_error()
    if error is not None:
        raise RuntimeError(f"GGUF tiles need radixlm._C: {error}")
    shape = (num_tiles(rows.shape[0]), tile_bytes(ggml_type, in_features))
    tiles = torch.empty(shape, dtype=torch.uint8) if arena is None else arena.empty(shape, torch.uint8)
    torch.ops.radixlm.gguf_pack_tiles(rows.contiguous(), ggml_type, in_features, tiles)
    return tiles


class GGUFLinear(nn.Module):
    """`y = x W^T + b` with W held as one or more GGUF weights stacked along the output features (a fused q/k/v or
    gate/up projection whose parts may have different block types); float32 in and out."""

    def __init__(self, parts: Sequence[WeightPart], bias: torch.Tensor | None = None,
                 kernels: GGUFKernels | None = None) -> None:
        """`kernels`: radixlm._C's (see `gguf_kernels`; the parts must then be tiled), or None for the PyTorch path
        (the parts in rows)."""
        super().__init__()
        if not 1 <= len(parts) <= MAX_PARTS:
            raise ValueError(f"a GGUF linear takes 1 to {MAX_PARTS} parts, got {len(parts)}")
        in_features = parts[0].in_features
        for part in parts:
            part.check()
            if part.in_features != in_features:
                raise ValueError("the parts of a GGUF linear must share in_features")
            if (part.tiles if kernels is not None else part.rows) is None:
                raise ValueError(f"a GGUF linear {'with' if kernels else 'without'} kernels needs its parts "
                                 f"{'tiled' if kernels else 'in rows'}")
        self.in_features = in_features
        self.parts = tuple(parts)
        self.out_features = sum(part.out_features for part in parts)
        if bias is not None and bias.shape != (self.out_features,):
            raise ValueError(f"bias must have shape [{self.out_features}], got {list(bias.shape)}")
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._kernels = kernels
        self._amx = kernels is not None and amx_available()
        # The kernel's arguments, built once. Plain attributes, not buffers: the weights are CPU-only and never saved.
        self._tiles = tuple(part.tiles for part in parts)
        self._types = tuple(part.ggml_type for part in parts)
        self._outs = tuple(part.out_features for part in parts)
        self.weight_bytes = sum(part.num_bytes for part in parts)

    @classmethod
    def concat(cls, linears: Sequence[GGUFLinear]) -> GGUFLinear:
        """One layer computing `linears`' outputs side by side (their weights shared, not copied)."""
        biases = [linear.bias for linear in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b if b is not None else torch.zeros(linear.out_features)
                              for b, linear in zip(biases, linears, strict=True)])
        return cls([part for linear in linears for part in linear.parts], bias, linears[0]._kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self._kernels is not None:
            amx = self._amx and rows.dtype == torch.bfloat16 and rows.shape[0] >= AMX_MIN_ROWS
            out = self._kernels.linear(rows, self._tiles, self._types, self._outs, self.bias,
                                       PATH_AMX if amx else PATH_BEST)
        else:
            out = self.reference_forward(rows)
        return out.reshape(*x.shape[:-1], self.out_features)

    def reference_forward(self, rows: torch.Tensor) -> torch.Tensor:
        """The PyTorch path: the activations quantized as the kernel does, times the dequantized weights, one slice
        of the weights at a time; float32 sums, returned in the rows' dtype (as the kernel does)."""
        activations = quantize_activations(rows.float())
        slice_rows = max(1, WEIGHT_SLICE_FLOATS // self.in_features)
        outputs = []
        for part in self.parts:
            for start in range(0, part.out_features, slice_rows):
                weight = part.dequantized_rows(start, min(part.out_features, start + slice_rows), self._kernels)
                outputs.append(F.linear(activations, weight))
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        if self.bias is not None:
            out += self.bias
        return out.to(rows.dtype)

    def extra_repr(self) -> str:
        kinds = "+".join(BLOCK_FORMATS[part.ggml_type].name for part in self.parts)
        return (f"in_features={self.in_features}, out_features={self.out_features}, blocks={kinds}, "
                f"bias={self.bias is not None}")


class GGUFEmbedding(nn.Module):
    """An embedding table kept in GGUF blocks: only the looked-up rows are dequantized (to `dtype`)."""

    def __init__(self, weight: WeightPart, dtype: torch.dtype = torch.float32,
                 kernels: GGUFKernels | None = None) -> None:
        super().__init__()
        weight.check()
        self.weight_part = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features
        self.dtype = dtype
        self._kernels = kernels
        self.weight_bytes = weight.num_bytes

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1)
        part = self.weight_part
        if part.rows is not None:
            values = dequantize(part.rows[ids], part.ggml_type, self.embedding_dim)
        else:
            values = self._kernels.rows(part.tiles, part.ggml_type, self.embedding_dim, self.num_embeddings, ids)
        return values.to(self.dtype).reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, blocks={BLOCK_FORMATS[self.weight_part.ggml_type].name}"
