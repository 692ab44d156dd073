"""Bfloat16 linears for CPUs where PyTorch has no fast bfloat16 matmul: the weight widened to float32 a block of
output features at a time, each block multiplied by MKL's float32 GEMM.

Without oneDNN's bfloat16 support (it needs AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX; an AVX2-only Zen 3 has none),
`F.linear` on bfloat16 tensors runs PyTorch's portable GEMM: measured on a Zen 3 (2 threads), 2x float32's time at
16 rows and 5-6x at 64-256 (a 1B model's 2,048 x 8,192 linear at 256 rows: 403 ms against 77 in float32). Widening
256 output features at a time into a float32 block that stays in cache and running `torch.mm` on it took 8.7 ms at
16 rows (26.2 with `F.linear` in bfloat16, 15.6 in float32: the weight is read as bfloat16) and 59 ms at 256. At a
decode step's 1-3 rows PyTorch's own bfloat16 path reads the weight fastest (1.8 against 10.3 ms at one row), so
those calls keep `F.linear`. The products are exact in float32 and summed in float32, rounded to bfloat16 once:
`radixlm.model.bf16_linear.reference_linear`'s contract, up to the order of the sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from radixlm.model.huge_pages import HugePageArena, move_parameters

# Calls with fewer rows keep `F.linear` (see the module docstring; widened at 4 rows: 0.75-0.88x its time on the 1B
# shapes, 1.1x on the default model's).
MIN_ROWS = 4
# Output features widened at a time: 256 measured fastest of 64 / 128 / 256 at 4-256 rows, K 576-8,192 (2-8 MB).
BLOCK = 256


def widened_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x W^T + b` for bfloat16 `x` [..., K] and `weight` [N, K]: float32 products and sums, bfloat16 out."""
    out_features, in_features = weight.shape
    rows = x.reshape(-1, in_features).float().t()  # [K, M]: each block's product comes out [b, M], contiguous
    products = torch.empty(out_features, rows.shape[1])
    block = torch.empty(min(BLOCK, out_features), in_features)
    for start in range(0, out_features, BLOCK):
        size = min(BLOCK, out_features - start)
        widened = block[:size]
        widened.copy_(weight[start:start + size])
        out = products[start:start + size]
        if bias is None:
            torch.mm(widened, rows, out=out)
        else:
            torch.addmm(bias[start:start + size].float().unsqueeze(1), widened, rows, out=out)
    result = torch.empty(*x.shape[:-1], out_features, dtype=torch.bfloat16)
    result.view(-1, out_features).copy_(products.t())
    return result


class WidenedLinear(nn.Module):
    """`y = x W^T + b` for bfloat16 CPU tensors: `widened_linear` from `MIN_ROWS` rows, `F.linear` below. Holds the
    `nn.Linear`'s own weight and bias (a head tied to the input embedding stays tied)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.weight.dtype != torch.bfloat16 or linear.weight.device.type != "cpu":
            raise ValueError(f"the widened linear takes a bfloat16 CPU weight, got {linear.weight.dtype} on "
                             f"{linear.weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        if x.numel() < MIN_ROWS * self.in_features:
            return F.linear(x, self.weight, self.bias)
        return widened_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_widened_linears(model: nn.Module) -> int:
    """Replace every bfloat16 CPU `nn.Linear` of `model` (a tied LM head included) by a `WidenedLinear` on the same
    weight, the weights moved onto huge pages for decode's streaming reads as `radixlm.model.prepacked_linear` does.
    Tensor-parallel shards (DTensor weights) and linears carrying hooks (transformers' tensor-parallel plan sums row
    shards in them) keep `nn.Linear`. Returns how many were replaced."""
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16
               and module.weight.device.type == "cpu" and not isinstance(module.weight, DTensor)
               and not (module._forward_hooks or module._forward_pre_hooks)]
    for name, linear in targets:
        model.set_submodule(name, WidenedLinear(linear))
    replaced = len(targets)
    # Through the new modules, not `targets`: each plain weight is then released as soon as its copy is placed.
    del targets
    move_parameters(model, (module.weight for module in model.modules() if isinstance(module, WidenedLinear)),
                    HugePageArena())
    return replaced
