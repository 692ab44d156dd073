"""GGUF's packed weight blocks: their formats, and their dequantization in pure torch (the reference).

A GGUF weight matrix [N, K] in a block format is stored as N rows of raw block bytes, a uint8 tensor
[N, K / block_weights * block_bytes]: each block holds `block_weights` consecutive weights of a row, with its scales.
The layouts are ggml's (gguf-py's `gguf/quants.py`, `dequantize_blocks`); `dequantize` reproduces gguf-py's float32
values exactly, with the same float operations in the same order.

The C++ kernel `radixlm._C.gguf_linear` (csrc/linear/linear_gguf.cpp) reads the same bits regrouped into tiles
(`radixlm.model.gguf_tiles`); this module does not import it, so it works without the extension.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

QK_K = 256  # weights per K-quant super-block


@dataclass(frozen=True)
class BlockFormat:
    """A ggml block format: `block_weights` weights stored in `block_bytes` bytes."""

    name: str
    block_weights: int
    block_bytes: int


# ggml type id (gguf.GGMLQuantizationType) -> format; the sizes are gguf.constants.GGML_QUANT_SIZES'.
BLOCK_FORMATS: dict[int, BlockFormat] = {
    2: BlockFormat("Q4_0", 32, 18),
    3: BlockFormat("Q4_1", 32, 20),
    8: BlockFormat("Q8_0", 32, 34),
    12: BlockFormat("Q4_K", QK_K, 144),
    14: BlockFormat("Q6_K", QK_K, 210),
}


def block_format(ggml_type: int) -> BlockFormat:
    """The format of `ggml_type`; ValueError naming it when it is not one of BLOCK_FORMATS."""
    fmt = BLOCK_FORMATS.get(int(ggml_type))
    if fmt is None:
        supported = ", ".join(f"{f.name} ({t})" for t, f in BLOCK_FORMATS.items())
        raise ValueError(f"ggml type {_type_name(ggml_type)} is not supported; supported: {supported}")
    return fmt


def row_bytes(ggml_type: int, in_features: int) -> int:
    """Bytes of one weight row of `in_features` weights; ValueError when the type is unsupported or `in_features`
    is not a positive multiple of its block."""
    fmt = block_format(ggml_type)
    if in_features <= 0 or in_features % fmt.block_weights != 0:
        raise ValueError(f"{fmt.name} rows hold a positive multiple of {fmt.block_weights} weights, "
                         f"got {in_features}")
    return in_features // fmt.block_weights * fmt.block_bytes


def dequantize(blocks: torch.Tensor, ggml_type: int, in_features: int) -> torch.Tensor:
    """float32 [N, K] weights from their blocks, uint8 [N, row_bytes(ggml_type, K)] (K = in_features), equal to
    gguf-py's `dequantize`. ValueError on a wrong dtype, shape or type."""
    size = row_bytes(ggml_type, in_features)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != size:
        raise ValueError(f"{block_format(ggml_type).name} blocks of {in_features} features must be uint8 "
                         f"[N, {size}], got {blocks.dtype} {list(blocks.shape)}")
    fmt = block_format(ggml_type)
    out_features = blocks.shape[0]
    flat = blocks.contiguous().reshape(-1, fmt.block_bytes)  # one block a row
    return _DEQUANTIZERS[int(ggml_type)](flat).reshape(out_features, in_features)


def _type_name(ggml_type: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return f"{GGMLQuantizationType(int(ggml_type)).name} ({int(ggml_type)})"
    except (ImportError, ValueError):
        return str(ggml_type)


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 field at byte `offset` of each block, as float32 [blocks, 1]."""
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).float()


def _words(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] (n a multiple of 4) as int32 [..., n / 4]: PyTorch's uint8 shifts and masks are many times
    slower than its int32 ones, and a mask of each byte's bits (0x0F0F0F0F) keeps the bytes apart."""
    if not packed.is_contiguous() or packed.storage_offset() % 4 != 0:  # a view of one block can be either
        packed = packed.clone(memory_format=torch.contiguous_format)
    return packed.view(torch.int32)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] (n a multiple of 4) -> [..., 2n]: the low nibbles, then the high ones (ggml's order within a
    group)."""
    words = _words(packed)
    low = (words & 0x0F0F0F0F).view(torch.uint8)
    high = ((words >> 4) & 0x0F0F0F0F).view(torch.uint8)
    return torch.stack([low, high], dim=-2).flatten(-2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # d (f16), 32 x int8: w = q * d
    return blocks[:, 2:].view(torch.int8).float().mul_(_half(blocks, 0))


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # d (f16), 16 bytes of nibbles: weight i < 16 in the low nibble of byte i, 16 + i in its high one; w = d (q - 8)
    return _nibbles(blocks[:, 2:]).float().sub_(8).mul_(_half(blocks, 0))  # q - 8 is exact in float


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # d, m (f16), 16 bytes of nibbles as in Q4_0; w = d q + m
    return _nibbles(blocks[:, 4:]).float().mul_(_half(blocks, 0)).add_(_half(blocks, 2))


def _q4_k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins of each Q4_K super-block from its 12 bytes [blocks, 12]: bytes 0-3 and 4-7
    hold scales and mins 0-3 in their low 6 bits and the top 2 bits of 4-7 in their high 2; bytes 8-11 the low
    4 bits of scales (low nibble) and mins (high nibble) 4-7."""
    scale_lo, min_lo, low4 = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([scale_lo & 0x3F, (low4 & 0x0F) | ((scale_lo >> 2) & 0x30)], dim=-1)
    mins = torch.cat([min_lo & 0x3F, (low4 >> 4) | ((min_lo >> 2) & 0x30)], dim=-1)
    return scales, mins


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # d, dmin (f16), 12 bytes of scales/mins, 128 bytes of nibbles: 4 groups of 32 bytes, each holding sub-block 2g
    # in its low nibbles and 2g + 1 in its high ones; w = (d scale) q - (dmin min) per 32-weight sub-block
    count = blocks.shape[0]
    scales, mins = _q4_k_scales(blocks[:, 4:16])
    scale = (_half(blocks, 0) * scales.float()).reshape(count, 8, 1)
    offset = (_half(blocks, 2) * mins.float()).reshape(count, 8, 1)
    q = _nibbles(blocks[:, 16:].reshape(count, 4, 32)).reshape(count, 8, 32).float()
    return q.mul_(scale).sub_(offset).reshape(count, QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d (f16). Each half of 128 weights takes
    # 64 low-nibble bytes (weights 0-63 in the low nibbles, 64-127 in the high ones) and 32 bytes of pairs (weights
    # 32s + i in bits 2s, 2s + 1 of byte i); w = (d scale) (q - 32), one scale per 16 weights
    count = blocks.shape[0]
    low = _nibbles(blocks[:, :128].reshape(count, 2, 64))
    pairs = _words(blocks[:, 128:192].reshape(count, 2, 1, 32))
    high = torch.cat([((pairs >> shift) & 0x03030303) << 4 for shift in (0, 2, 4, 6)], dim=2)  # pair at bits 4-5
    q = (_words(low) | high.reshape(count, 2, 32)).view(torch.uint8).float().sub_(32)  # q - 32 is exact in float
    scale = _half(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()
    return q.reshape(count, 16, 16).mul_(scale.reshape(count, 16, 1)).reshape(count, QK_K)


_DEQUANTIZERS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    2: _q4_0, 3: _q4_1, 8: _q8_0, 12: _q4_k, 14: _q6_k,
}
