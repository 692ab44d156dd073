"""Bfloat16 linears on AMX-BF16 tiles through radixlm._C's own kernel (csrc/linear/amx_bf16.cpp).

A decode step multiplies a few rows by every weight once: it is a read of the weights. oneDNN's linear on its own
prepacked layout (`radixlm.model.prepacked_linear`) read the default model's weights at 13-16 GB/s on a Xeon with AMX
(2 threads, 1-32 rows) where a plain reduction over the same tensors reads 36 GB/s; the AMX kernel streams each
thread's share of the weight front to back with software prefetch and read them 1.5-2x faster (the 1B shape's larger
matrices: 1.15x). Chosen at run time: on a CPU without AMX-BF16 (or an OS that refuses its tiles) the bfloat16
linears keep oneDNN's prepacked path.

The weight's layout, `[N / 32, K / 2, 32, 2]` (`pack`): for each group of 32 output features, K / 2 rows of 32 pairs of
consecutive input features (AMX's VNNI layout for its B tiles), so one thread's share is one contiguous run. `unpack`
and `reference_linear` are its pure-PyTorch inverse and reference, which the tests hold the kernel to.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.ops import direct_kernel, kernels_available

GROUP = 32  # output features per group of the packed layout; input features come in steps of 32 too


@cache
def amx_available() -> bool:
    """radixlm._C is built and this CPU runs its AMX-BF16 kernel (the OS granting the tiles)."""
    return kernels_available() and bool(direct_kernel("amx_bf16_available")())


def fits(out_features: int, in_features: int) -> bool:
    """Whether a weight of this shape can take the packed layout."""
    return out_features > 0 and in_features > 0 and out_features % GROUP == 0 and in_features % GROUP == 0


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] in the kernel's layout [N / 32, K / 2, 32, 2] (a new tensor, same dtype)."""
    out_features, in_features = weight.shape
    if not fits(out_features, in_features):
        raise ValueError(f"a packed weight needs both sizes multiples of {GROUP}, got {tuple(weight.shape)}")
    grouped = weight.reshape(out_features // GROUP, GROUP, in_features // 2, 2)
    return grouped.permute(0, 2, 1, 3).contiguous()


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack`: [N, K]."""
    groups, pairs, group, two = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(groups * group, pairs * two)


def reference_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's result in PyTorch: float32 products and sums of the bfloat16 inputs, rounded to bfloat16 once."""
    float_bias = None if bias is None else bias.float()
    return F.linear(x.float(), unpack(packed).float(), float_bias).to(torch.bfloat16)


class AmxLinear(nn.Module):
    """`y = x W^T + b` for bfloat16 CPU tensors, W packed once for the AMX kernel (see the module docstring)."""

    def __init__(self, packed: nn.Parameter, bias: torch.Tensor | None) -> None:
        super().__init__()
        groups, pairs, group, two = packed.shape
        self.in_features, self.out_features = pairs * two, groups * group
        self.packed = packed
        self.bias = bias
        self._kernel = direct_kernel("amx_bf16_linear")

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> AmxLinear:
        """`linear`'s weight packed (a bfloat16 CPU `nn.Linear` whose shape `fits`)."""
        return cls(pack_parameter(linear.weight), linear.bias)

    @property
    def weight_bytes(self) -> int:
        """The bytes of the weight one forward reads."""
        return self.packed.numel() * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        return self._kernel(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class PackedEmbedding(nn.Module):
    """An input embedding that reads its rows out of the packed weight of the LM head tied to it: one copy of the
    vocabulary matrix serves both (a plain copy beside the packed one would add 56 MB to the default model and 0.5 GB
    to a 1B model with a 128k vocabulary)."""

    def __init__(self, packed: nn.Parameter) -> None:
        super().__init__()
        self.packed = packed
        self.embedding_dim = packed.shape[1] * packed.shape[3]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.packed[input_ids // GROUP, :, input_ids % GROUP, :]  # [..., K / 2, 2]
        return rows.reshape(*input_ids.shape, self.embedding_dim)


def pack_parameter(weight: torch.Tensor) -> nn.Parameter:
    """A bfloat16 CPU weight [N, K] packed, as a frozen parameter."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        raise ValueError(f"the AMX linear takes a bfloat16 CPU weight, got {weight.dtype} on {weight.device}")
    return nn.Parameter(pack(weight.detach()), requires_grad=False)
