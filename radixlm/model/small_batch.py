"""Linear layers at small batch through the C++ kernels of `radixlm._C` (csrc/linear/linear.cpp and linear_int8.cpp).

At batch 1 (a decode step of one request) every linear layer is a matrix-vector product that must read all of its
weights once: memory-bound. PyTorch's float32 `F.linear` (MKL sgemm) measured about 3-4x the time a plain streaming
read of the same weights takes at M = 1 on this CPU, and fbgemm's int8 dynamic linear, wrapped with the per-token
scaling of `Int8Linear`, about 2x; the C++ kernels stream each weight row once and stay within a few percent to ~25%
of that read time at a few rows; at a decode batch of 16-64 rows the float32 kernel multiplies at 130-165 GFLOP/s
(two threads of a Zen 4), where MKL (whose verbose log names no vector extension on that AMD CPU) ran at 50-115 at
16 rows. Above `MAX_ROWS` rows (`INT8_MAX_ROWS` for int8) the PyTorch kernels (the reference) run.

Eager calls go straight to the extension's Python functions (csrc/bindings.cpp), not through `torch.ops`: the
dispatcher's argument parsing and boxing cost about 0.8 us of a ~1 us call at one row, ~0.1 ms of a batch-1 forward.
`torch.compile` would break its graph at those calls; the registered ops (`torch.ops.radixlm.*`, with fake kernels)
compute the same and are what a compiled model should call.

The int8 kernel computes exactly what fbgemm computes for `Int8Linear` (same quantized activations, exact int32 sums,
the same float rounding steps), so a row's output is bit-identical on either path and never depends on the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from radixlm.model.huge_pages import HugePageArena, huge_page_buffer, move_parameters
from radixlm.model.ops import direct_kernel, extension_error, kernel_isa, kernels_available

MAX_ROWS = 64  # the float32 kernel's limit (csrc/linear/linear.cpp's kMaxRows): rows of x (tokens) per call
# The AVX2 build's float32 kernel (6 rows a pass, by 8-lane halves) falls behind MKL above about 32 rows: the default
# model's decode step (RADIXLM_KERNEL_ISA=avx2 on a Zen 4) at 32 rows 141 ms with MKL, 119-122 with it; at 64
# 215 against 222-227.
AVX2_MAX_ROWS = 32
# The int8 kernel's limit (csrc/linear/linear_int8.cpp's kMaxInt8Rows): with AVX-512 VNNI each extra row costs the int8
# multiply-adds of one token (compute), less than fbgemm's path (with Int8Linear's scaling around it) up to about
# 96 rows on a Xeon: 24.0 against 31.3 ms for the default model's linears at 32 rows, 45.2 against 51.9 at 64.
INT8_MAX_ROWS = 64
INT8_ROW_ALIGN = 64  # int8 weight rows are zero-padded to whole 64-byte loads
INT8_TILE_ROWS = 8  # linear_int8.cpp's kInt8TileRows: the int8 weights are packed by tiles of this many rows
INT8_MAX_FEATURES = 8192  # linear_int8.cpp's kMaxK: the bytes of a quantized row


def int8_kernel_is_vectorized() -> bool:
    """True where the extension's AVX-512 build runs (`radixlm.model.ops.kernel_isa`): the int8 kernel is written for
    AVX-512 VNNI. Elsewhere it falls back to a plain loop, slower than fbgemm, so the int8 linears stay on fbgemm
    there."""
    return kernel_isa() == "avx512"


def float32_kernel_rows() -> int:
    """Up to how many rows `SmallBatchLinear` runs the float32 kernel: `MAX_ROWS` in the extension's AVX-512 build,
    `AVX2_MAX_ROWS` in the AVX2 one (`radixlm.model.ops.kernel_isa`)."""
    return MAX_ROWS if kernel_isa() == "avx512" else AVX2_MAX_ROWS


class SmallBatchLinear(nn.Linear):
    """A float32 `nn.Linear` that runs the C++ kernel for up to `max_rows` rows (`float32_kernel_rows`) and
    `F.linear` above."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> SmallBatchLinear:
        """Shares `linear`'s parameters (no copy)."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight = linear.weight
        module.bias = linear.bias
        module._kernel = direct_kernel("small_batch_linear")
        module.max_rows = float32_kernel_rows()
        module._max_numel = module.max_rows * module.in_features
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Per call overhead matters at one row (a forward has ~200 linears): one size test, one op call.
        if x.numel() > self._max_numel or x.dtype != torch.float32 or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        return self._kernel(x, self.weight, self.bias)


def use_small_batch_linears(model: nn.Module) -> int:
    """Replace every float32 `nn.Linear` of `model` by a `SmallBatchLinear` sharing its weights, then move those
    weights onto huge pages (`move_parameters`; a tied input embedding moves with its LM head); returns how many
    linears. Needs the extension (see `kernels_available`).

    Huge pages, because a batch-1 step streams every weight once: the default model's float32 decode 1.035-1.064x
    faster while the memory ran fast, 0.98x in a slow phase (`benchmarks/huge_pages.py`, the two placements
    alternated in one process; Zen 4, 2026-12-05)."""
    if not kernels_available():
        raise RuntimeError(f"radixlm._C is not built: {extension_error()}")
    names = [name for name, module in model.named_modules()
             if type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.is_contiguous()]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, SmallBatchLinear.from_linear(getattr(parent, child)))
    # A generator, so that no list keeps the old weights alive while they are copied one by one.
    weights = (weight for weight in (model.get_submodule(name).weight for name in names)
               if weight.device.type == "cpu" and not isinstance(weight, DTensor))
    move_parameters(model, weights, HugePageArena())
    return len(names)


def pack_int8_tiles(rows: torch.Tensor) -> torch.Tensor:
    """`[N, K_pad]` int8 rows in the order the int8 kernel streams them: tiles of `INT8_TILE_ROWS` rows, each holding
    the first 64 bytes of its rows, then the next 64 of each, and so on (one sequential read per tile); the rows after
    the last whole tile stay as they are."""
    num_packed = rows.shape[0] // INT8_TILE_ROWS * INT8_TILE_ROWS
    tiles = rows[:num_packed].view(-1, INT8_TILE_ROWS, rows.shape[1] // INT8_ROW_ALIGN, INT8_ROW_ALIGN)
    packed = rows.clone()
    packed[:num_packed] = tiles.transpose(1, 2).reshape(num_packed, rows.shape[1])
    return packed


class Int8Rows:
    """The int8 kernel's copy of an int8 weight `[N, K]`: rows zero-padded to `INT8_ROW_ALIGN` bytes and packed by
    tiles (`pack_int8_tiles`), the float32 scale and the int32 sum of each row (fbgemm's zero-point correction)."""

    def __init__(self, int8_weight: torch.Tensor, scales: torch.Tensor) -> None:
        out_features, in_features = int8_weight.shape
        padded = -(-in_features // INT8_ROW_ALIGN) * INT8_ROW_ALIGN
        rows = torch.zeros(out_features, padded, dtype=torch.int8)
        rows[:, :in_features] = int8_weight
        self.weight = pack_int8_tiles(rows)
        self.scales = scales.float().contiguous()
        self.sums = int8_weight.sum(dim=1, dtype=torch.int32)

    @staticmethod
    def supported(in_features: int) -> bool:
        return in_features <= INT8_MAX_FEATURES and kernels_available()

    def arguments(self, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                           torch.Tensor | None]:
        """What the int8 kernel (`direct_kernel("small_batch_int8_linear")`) takes after x."""
        return self.weight, self.scales, self.sums, bias


def gather_int8_weights(rows: list[Int8Rows]) -> None:
    """Move the int8 kernel's weights of `rows` into one huge-page buffer, back to back in the order given (the
    model's module order keeps each layer's weights together).

    A batch-1 step streams every weight once, ~121 tensors on the default model: on 4 KiB pages that is a TLB miss
    every 4 KiB. In one engine, alternating step by step between these weights and per-tensor copies, the int8 linears
    took 5-7% less (3.81 -> 3.54, 3.79 -> 3.53, 3.70 -> 3.51 ms a step, three processes) and the step 0.2-0.3 ms
    less. A plain read of the weights gains a little too, so their ratio to that bound moves less (1.34 -> 1.30)."""
    buffer = huge_page_buffer(sum(r.weight.numel() for r in rows))
    offset = 0
    for r in rows:
        view = buffer[offset:offset + r.weight.numel()].view(r.weight.shape)
        view.copy_(r.weight)
        r.weight = view
        offset += r.weight.numel()
