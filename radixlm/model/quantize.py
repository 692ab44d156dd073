"""int8 weights (`--quantization int8`): every `nn.Linear` becomes an `Int8Linear` running PyTorch's fbgemm kernel.

Weights are int8 with one scale per output channel (symmetric, quantized once at load time); activations are
quantized per token at every call. PyTorch's dynamic int8 linear (`torch.ops.quantized.linear_dynamic`, fbgemm)
measured about twice as fast as fp32 at batch 1 and 1.5x at batch 64 on this AVX2 CPU; torchao's eager int8
kernels were 10-20x slower than it at batch 1 (they need `torch.compile`), and `torch._int_mm` /
`torch._weight_int8pack_mm` were far slower at batch > 1. Up to `INT8_MAX_ROWS` rows, radixlm._C's int8 kernel computes
the same numbers faster (`radixlm.model.small_batch`).

fbgemm picks one activation scale for the whole input, which would make a token's output depend on the other tokens
of its batch (and greedy output on batching and chunking). We make it per token: each row is divided by its own
absolute maximum, and a fixed row holding +1 and -1 is appended so the kernel's range is always exactly [-1, 1];
the output rows are multiplied back by their maxima. A row's result is then a function of that row alone.

Precision: on CPUs without VNNI fbgemm multiplies uint8 activations by int8 weights in pairs summed into a saturating
int16, so 8-bit activations times 8-bit weights can overflow (255 * 127 * 2 > 32767); PyTorch's default avoids it
with 7-bit activations (`reduce_range`). Weights in [-64, 64] with full 8-bit activations cannot overflow
(255 * 64 * 2 = 32640) and measured much closer to float32 on the default model (mean |log-prob delta| per token
0.41 against 0.64, argmax agreement 82% against 73%), so that is what we use.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from radixlm.model.ops import direct_kernel, kernels_available
from radixlm.model.small_batch import INT8_MAX_ROWS, Int8Rows, gather_int8_weights

# Rows that are all zeros keep a tiny positive maximum: 0 / tiny = 0, and no NaN.
_TINY = torch.finfo(torch.float32).tiny
WEIGHT_LEVELS = 64  # weights in [-64, 64]: see "Precision" above
REDUCE_RANGE = False


class Int8Linear(nn.Module):
    """Drop-in for a float32 `nn.Linear`: int8 per-channel weights, per-token int8 activations, float32 output."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, small_batch: bool | None = None,
                 fused_scaling: bool | None = None) -> None:
        """`small_batch`: run up to `INT8_MAX_ROWS` rows through radixlm._C's int8 kernel (bit-identical, faster; it
        keeps its own copy of the int8 weights). `fused_scaling`: above that, scale the rows before and after fbgemm
        with radixlm._C's two calls instead of six PyTorch ops (bit-identical). None: when the extension is built."""
        super().__init__()
        if weight.dtype != torch.float32:
            raise ValueError(f"int8 quantization needs float32 weights, got {weight.dtype}")
        self.out_features, self.in_features = weight.shape
        if self.in_features < 2:  # the range row must hold both +1 and -1
            raise ValueError(f"int8 quantization needs in_features >= 2, got {self.in_features}")
        weight = weight.detach()
        scales = (weight.abs().amax(dim=1) / WEIGHT_LEVELS).clamp_min(_TINY).double()
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():
            # Quantized tensors are deprecated as a user-facing type; fbgemm's prepack still takes one (torch 2.13).
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        if small_batch is None:
            small_batch = Int8Rows.supported(self.in_features)
        if fused_scaling is None:
            fused_scaling = kernels_available()
        self._normalize_rows = direct_kernel("int8_normalize_rows") if fused_scaling else None
        self._rescale_rows = direct_kernel("int8_rescale_rows_") if fused_scaling else None
        self._small_batch = Int8Rows(qweight.int_repr(), qweight.q_per_channel_scales()) if small_batch else None
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        # The kernel's arguments after x, gathered once: a forward makes ~120 of these calls at batch 1, where each
        # attribute lookup through nn.Module and each extra Python frame is a visible share of the call.
        self.refresh_kernel_arguments()
        self._small_batch_kernel = None if self._small_batch is None else direct_kernel("small_batch_int8_linear")
        range_row = torch.zeros(1, self.in_features)
        range_row[0, 0], range_row[0, -1] = 1.0, -1.0
        self.register_buffer("range_row", range_row, persistent=False)
        self.weight_bytes = weight.numel() + 4 * self.out_features  # int8 values + float32 scales

    def refresh_kernel_arguments(self) -> None:
        """Gather the small-batch kernel's arguments after x again (after its tensors move, or at construction)."""
        self._small_batch_args = None if self._small_batch is None else self._small_batch.arguments(self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, small_batch: bool | None = None,
                    fused_scaling: bool | None = None) -> Int8Linear:
        return cls(linear.weight, linear.bias, small_batch, fused_scaling)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._small_batch_args is not None and x.numel() <= INT8_MAX_ROWS * self.in_features:
            return self._small_batch_kernel(x, *self._small_batch_args)
        rows = x.reshape(-1, self.in_features)
        if self._normalize_rows is not None:
            row_max = rows.new_empty(rows.shape[0])
            normalized = self._normalize_rows(rows, row_max)
            out = torch.ops.quantized.linear_dynamic(normalized, self._packed, REDUCE_RANGE)
            out = self._rescale_rows(out, row_max, self.bias)[:-1]  # in place; the range row's output is dropped
        else:
            out = self._scaled_linear(rows)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _scaled_linear(self, rows: torch.Tensor) -> torch.Tensor:
        """fbgemm with the per-token scaling in PyTorch ops: the reference for the fused calls."""
        # abs().amax(): the same exact values as vector_norm(ord=inf), which took 20x longer here (a slow path).
        row_max = rows.abs().amax(dim=1, keepdim=True).clamp_min_(_TINY)
        normalized = torch.cat((rows / row_max, self.range_row))
        out = torch.ops.quantized.linear_dynamic(normalized, self._packed, REDUCE_RANGE)[:-1]
        out = out * row_max
        if self.bias is not None:
            out += self.bias
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_model(model: nn.Module, method: str, small_batch: bool | None = None,
                   fused_scaling: bool | None = None) -> int:
    """Replace every float32 `nn.Linear` of `model` (the LM head included) in place; returns how many.

    A head tied to the input embedding gets its own int8 copy: the embedding lookup stays float32. `small_batch`,
    `fused_scaling`: see `Int8Linear`.
    """
    if method != "int8":
        raise ValueError(f"quantize_model makes int8 linears, got quantization {method!r}")
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear.from_linear(linear, small_batch, fused_scaling))
    kernel_modules = [m for m in model.modules() if isinstance(m, Int8Linear) and m._small_batch is not None]
    if kernel_modules:
        gather_int8_weights([m._small_batch for m in kernel_modules])
        for module in kernel_modules:
            module.refresh_kernel_arguments()
    return len(targets)
