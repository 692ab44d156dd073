"""Bfloat16 linears whose decode-sized calls run one of radixlm._C's row kernels on the plain nn.Linear weight,
chosen at run time: AMX-BF16 tiles (csrc/linear/amx_bf16.cpp) where the CPU has them, else AVX-512 BF16 dot
products (csrc/linear/bf16_dot.cpp); `F.linear` takes the calls with more rows.

A decode step multiplies a few rows by every weight once: it is a read of the weights. Over the default model's fused
linears (q/k/v, o, gate/up, down; 30 layers) on a Xeon with AMX (2 threads), the AMX kernel, each thread streaming
its share of the plain weight front to back, took 9.7 / 10.4 / 12.4 ms at 1 / 16 / 32 rows against oneDNN's
prepacked path's (`radixlm.model.prepacked_linear`) 12.7 / 13.0 / 15.6 and `F.linear`'s 18.2 / 19.0 / 20.8 (one
sitting). From 128-320 rows on (prefill chunks; `amx_row_limit`) oneDNN's matmul catches up and then wins (at 512
rows: 74 against 93 ms), so those calls go to `F.linear`. On a Zen 4 (AVX-512 BF16, no AMX) the dot-product kernel
over the same linears, weights cold: 9.5 / 15.9 / 28.6 ms at 1 / 16 / 32 rows against the prepacked path's 12.8 /
20.3 / 27.9 and `F.linear`'s 16.9 / 27.8 / 32.1; at 64 rows 47.6 against 43.1 and 52.1, so it stops at
`DOT_MAX_ROWS`. The weight keeps nn.Linear's `[N, K]` layout: no second copy, and an LM head tied to the input
embedding shares it as before. On a CPU with neither, the bfloat16 linears keep oneDNN's prepacked path.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.huge_pages import HugePageArena
from radixlm.model.ops import direct_kernel, kernels_available

GROUP = 32  # the AMX kernel's output features per group, and both kernels' input features per step
AMX, DOT, PACKED = "amx", "dot", "packed"  # the kernels: AMX and DOT read the plain weight, PACKED its own layout
# How many rows a call runs on the AMX kernel, `F.linear` above. The kernel reads x's rows again for every group of 32
# outputs, which stays cheap while they fit in L2 beside the weight's group: up to `AMX_MIN_ROWS` rows always, up to
# `AMX_MAX_ROWS` while x's rows take at most `AMX_ROW_BYTES` (the kernel's own chunks of a larger call follow the same
# 1 MiB, csrc/linear/amx_bf16.cpp). At 512 KiB, the default model's down projection (K 1,536) went to oneDNN from 171
# rows and the 1B shape's K 2,048 projections from 129; at 1 MiB (320 and 256 rows), one engine alternating the two
# limits in prefills (a Xeon with AMX, 2 threads): the default model's 200 / 287 tokens 1.069x / 1.153x faster, the 1B
# shape's 200 / 256 tokens 1.058x / 1.048x. Wider x (K 4,096 and up) stays at 128 rows: the 8B shape's gate/up
# projection lost with 256-row chunks. (The 2026-12-04 Xeon, kernel against F.linear in a micro over the 1B shape's
# linears at 96 / 128 / 160 / 192 / 256 rows: 1.37x / 1.18x / 0.96x / 0.90x / 0.96x; in place, in whole prefills,
# the kernel's residual and silu epilogues now count for it.)
AMX_MIN_ROWS = 128
AMX_MAX_ROWS = 320
AMX_ROW_BYTES = 1 << 20
# The dot-product kernel reads x's rows from L1 for each group of 4 weight rows; past 32 rows oneDNN's matmul wins.
DOT_MAX_ROWS = 32


def amx_row_limit(in_features: int) -> int:
    """The most rows of `in_features` a call runs on the kernel (see AMX_MIN_ROWS)."""
    return max(AMX_MIN_ROWS, min(AMX_MAX_ROWS, AMX_ROW_BYTES // (2 * in_features)))


@cache
def amx_available() -> bool:
    """radixlm._C is built and this CPU runs its AMX-BF16 kernel (the OS granting the tiles)."""
    return kernels_available() and bool(direct_kernel("amx_bf16_available")())


@cache
def dot_available() -> bool:
    """radixlm._C is built and this CPU runs its AVX-512 BF16 dot-product kernel."""
    return kernels_available() and bool(direct_kernel("avx512_bf16_available")())


def available_kernel() -> str | None:
    """The kernel this CPU runs best: AMX, else PACKED (AVX-512 BF16; DOT serves a tied LM head there), else None
    (oneDNN's prepacked path)."""
    return AMX if amx_available() else PACKED if dot_available() else None


def row_limit(kernel: str, in_features: int) -> int:
    """The most rows of `in_features` a call runs on `kernel`, `F.linear` above."""
    return amx_row_limit(in_features) if kernel == AMX else DOT_MAX_ROWS


def fits(out_features: int, in_features: int, kernel: str = AMX) -> bool:
    """Whether `kernel` (AMX, DOT or PACKED) takes a weight of this shape (both sizes positive, the input size a
    multiple of 32, and for AMX the output size too)."""
    return (out_features > 0 and in_features > 0 and in_features % GROUP == 0
            and (kernel != AMX or out_features % GROUP == 0))


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's result in PyTorch: float32 products and sums of the bfloat16 inputs, rounded to bfloat16 once."""
    float_bias = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), float_bias).to(torch.bfloat16)


class Bf16Linear(nn.Module):
    """`y = x W^T + b` for bfloat16 CPU tensors: row kernel `kernel` (AMX or DOT) up to `row_limit` rows, `F.linear`
    above. Holds the `nn.Linear`'s own weight and bias (a tied weight stays tied)."""

    def __init__(self, linear: nn.Linear, kernel: str = AMX) -> None:
        super().__init__()
        weight = linear.weight
        if kernel not in (AMX, DOT):  # PACKED is `DotPackedLinear`
            raise ValueError(f"kernel must be {AMX!r} or {DOT!r}, got {kernel!r}")
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not fits(*weight.shape, kernel):
            raise ValueError(f"the {kernel} linear takes a bfloat16 CPU weight with sizes multiples of {GROUP}, got "
                             f"{weight.dtype} {tuple(weight.shape)} on {weight.device}")
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        self.weight = weight if weight.is_contiguous() else nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = linear.bias
        self._kernel = direct_kernel("amx_bf16_linear" if kernel == AMX else "bf16_dot_linear")
        self._kernel_add = direct_kernel("amx_bf16_linear_add") if kernel == AMX else None
        self._kernel_gated = direct_kernel("amx_bf16_gated_linear") if kernel == AMX else None
        self._max_elements = row_limit(kernel, self.in_features) * self.in_features

    @property
    def row_limit(self) -> int:
        """The most rows a call runs on the kernel; `F.linear` takes more."""
        return self._max_elements // self.in_features

    @property
    def weight_bytes(self) -> int:
        """The bytes of the weight one forward reads."""
        return self.weight.numel() * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        if x.numel() <= self._max_elements:
            return self._kernel(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`residual + forward(x)` for a bfloat16 `residual` of the output's shape, the sum taken in float32 and
        rounded once: in the AMX kernel's writes, or through `torch.addmm` (oneDNN adds it in its epilogue) where
        `F.linear` would run. Apart, each add was a pass over rows the linear had just written (two threads by
        columns, read back by rows): 73 us an add at 287 rows in a mixed step of the default model, 18 us at 32 rows
        in a decode step, against 17 and 5 us over rows in cache (a Xeon with AMX, 2 threads)."""
        if x.dtype == residual.dtype == torch.bfloat16:
            if x.numel() > self._max_elements and self.bias is None:  # F.linear's rows
                out = torch.addmm(residual.reshape(-1, self.out_features), x.reshape(-1, self.in_features),
                                  self.weight.t())
                return out.view(residual.shape)
            if x.numel() <= self._max_elements and self._kernel_add is not None:  # the AMX kernel's rows
                return self._kernel_add(x, self.weight, residual, self.bias)
        return residual + self.forward(x)  # the DOT kernel's rows, a bias above the kernel's, float32 rows

    def forward_gated(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of a gated MLP whose gate and up rows this weight holds interleaved by 16
        (`FusedGatedMLP.interleave_halves`), for any number of bfloat16 rows: `amx_bf16_gated_linear`, which takes a
        prefill's rows in chunks (0.89-0.97x the time of `F.linear` and a `silu_and_mul` pass at 512 and 2,048 rows,
        cold weights of the default model and the 1B shape)."""
        return self._kernel_gated(x, self.weight)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kernel}")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`[N, K]` bfloat16 -> the PACKED kernel's layout, int32 `[ceil(N / 32), K / 2, 32]`: block b, pair p, feature
    j holds `weight[32b + j, 2p]` (low half) and `weight[32b + j, 2p + 1]` (high half); zeros past N."""
    out_features, in_features = weight.shape
    words = weight.contiguous().view(torch.int32)  # [N, K / 2]: each word one pair, the first in its low half
    padding = -out_features % GROUP
    if padding:
        words = torch.cat([words, words.new_zeros(padding, in_features // 2)])
    return words.reshape(-1, GROUP, in_features // 2).transpose(1, 2).contiguous()


class DotPackedLinear(nn.Module):
    """`y = x W^T + b` for bfloat16 CPU tensors on any number of rows, through the PACKED kernel
    (csrc/linear/bf16_packed.cpp: AVX-512 BF16 dot products over `pack_weight`'s layout). The packed weight replaces
    the plain one (no second copy), so a head tied to the embedding cannot take it."""

    reads_strided_rows = True  # x may be a view of evenly spaced rows (silu_and_mul_padded's), read without a copy

    def __init__(self, linear: nn.Linear, arena: HugePageArena | None = None) -> None:
        """`arena`: where the packed weight is placed (huge pages, for a decode step's streaming reads)."""
        super().__init__()
        weight = linear.weight.detach()
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not fits(*weight.shape, PACKED):
            raise ValueError(f"the packed linear takes a bfloat16 CPU weight with in_features a multiple of {GROUP}, "
                             f"got {weight.dtype} {tuple(weight.shape)} on {weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias
        # A buffer, not a parameter: the same values as the weight, in the kernel's layout.
        packed = pack_weight(weight)
        self.register_buffer("packed", arena.place(packed) if arena is not None else packed, persistent=False)
        self._kernel = direct_kernel("bf16_packed_linear")

    @property
    def weight_bytes(self) -> int:
        """The bytes of the weight one forward reads."""
        return self.in_features * self.out_features * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        return self._kernel(x, self.packed, self.out_features, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
