"""The GGUF kernel's weight layout: rows of GGUF blocks regrouped into tiles of 16 output rows (pure torch).

radixlm._C's `gguf_linear` multiplies int8 activations by 4-, 6- and 8-bit weights with one instruction per 4 weights
of 16 output rows (AVX-512 VNNI's `vpdpbusd`: unsigned weight bytes times signed activation bytes, summed by fours
into 16 int32 lanes). It wants, for each 32 weights of a row (a "K-block"), the quants of 16 rows side by side:
vector g of a K-block holds weights 4g .. 4g + 3 of each of the 16 rows. `pack_tiles` moves the file's bits into that
order once, at load; no value changes (Q8_0's signed quants are stored offset by 128, Q4_K's 6-bit scales unpacked
to a byte each), so a tile holds exactly the weights of the file.

A tile is a sequence of super-blocks (32 weights for Q8_0 / Q4_0 / Q4_1, 256 for Q4_K / Q6_K), each its metadata for
the 16 rows and then the quants of its K-blocks (r: the row in the tile, i < 4):

| format | metadata (16 rows each)                   | quants of one K-block                                       |
|--------|-------------------------------------------|-------------------------------------------------------------|
| Q8_0   | d f16                                     | 8 x 64 bytes: vector g, byte 4r + i = q[r][4g+i] + 128      |
| Q4_0   | d f16                                     | 4 x 64 bytes: vector p, byte 4r + i = q[r][4p+i] (low       |
|        |                                           | nibble), q[r][16+4p+i] (high nibble)                        |
| Q4_1   | d f16, m f16                              | as Q4_0                                                     |
| Q4_K   | d f16, dmin f16, 8 x scale u8, 8 x min u8 | as Q4_0                                                     |
| Q6_K   | d f16, 16 x scale s8                      | the low 4 bits as Q4_0, then 2 x 64 bytes of the high 2:    |
|        |                                           | vector h, bits 2c, 2c+1 of byte 4r + i = q[r][4(4h+c)+i]'s  |

Rows past the last whole tile are zero (a zero scale: weights 0); the kernel writes only the real rows.

`pack_tiles` here is the reference; the loader runs radixlm._C's `gguf_pack_tiles` (the same bytes,
`tests/unit/test_gguf_kernel.py`; csrc/linear/gguf_pack.cpp), which writes each tile once into its final place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.model.gguf_blocks import BLOCK_FORMATS, QK_K, block_format, row_bytes

TILE_ROWS = 16
K_BLOCK = 32  # weights per K-block: one activation scale, 8 vectors of 4 weights per row


@dataclass(frozen=True)
class TileFormat:
    """A format's tile layout: `super_weights` weights per super-block, its `meta_bytes` of metadata for the 16
    rows, then `super_weights / 32` K-blocks of `kblock_bytes` bytes of quants each."""
    super_weights: int
    meta_bytes: int
    kblock_bytes: int

    @property
    def super_bytes(self) -> int:
        return self.meta_bytes + self.super_weights // K_BLOCK * self.kblock_bytes


TILE_FORMATS: dict[int, TileFormat] = {
    8: TileFormat(32, 32, 512),  # Q8_0
    2: TileFormat(32, 32, 256),  # Q4_0
    3: TileFormat(32, 64, 256),  # Q4_1
    12: TileFormat(QK_K, 64 + 256, 256),  # Q4_K
    14: TileFormat(QK_K, 32 + 256, 384),  # Q6_K
}


def num_tiles(out_features: int) -> int:
    return -(-out_features // TILE_ROWS)


def tile_bytes(ggml_type: int, in_features: int) -> int:
    """Bytes of one tile of 16 rows of `in_features` weights."""
    row_bytes(ggml_type, in_features)  # checks the type and the feature count
    fmt = TILE_FORMATS[int(ggml_type)]
    return in_features // fmt.super_weights * fmt.super_bytes


def _nibble_pairs(q: torch.Tensor) -> torch.Tensor:
    """Quants [..., rows, 32] (0-15) of one K-block -> [..., 4, rows, 4] bytes: vector p, row r, byte i holds
    q[r][4p+i] in its low nibble and q[r][16+4p+i] in its high one."""
    lead = q.shape[:-2]
    rows = q.shape[-2]
    halves = q.reshape(*lead, rows, 2, 4, 4)  # [.., r, half, p, i]
    paired = halves[..., 0, :, :] | (halves[..., 1, :, :] << 4)  # [.., r, p, i]
    return paired.transpose(-3, -2)  # [.., p, r, i]


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] -> [..., 2, n]: low nibbles, then high ones."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-2)


def _q4_k_quants(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_K super-blocks [..., 144] -> their 256 quants (0-15) in weight order, [..., 8, 32]."""
    groups = blocks[..., 16:].reshape(*blocks.shape[:-1], 4, 32)  # group g: sub-blocks 2g (low), 2g + 1 (high)
    return _unpack_nibbles(groups).reshape(*blocks.shape[:-1], 8, 32)


def _q6_k_quants(blocks: torch.Tensor) -> torch.Tensor:
    """Q6_K super-blocks [..., 210] -> their 256 quants (0-63) in weight order, [..., 8, 32]."""
    lead = blocks.shape[:-1]
    low = _unpack_nibbles(blocks[..., :128].reshape(*lead, 2, 2, 32))  # [.., half, 32-byte run, nibble, 32]
    low = low.transpose(-3, -2).reshape(*lead, 2, 4, 32)  # [.., half, s = 2 nibble + run, 32]
    high = blocks[..., 128:192].reshape(*lead, 2, 1, 32)
    high = torch.cat([(high >> (2 * s)) & 3 for s in range(4)], dim=-2)  # [.., half, s, 32]
    return (low | (high << 4)).reshape(*lead, 8, 32)


def pack_tiles(blocks: torch.Tensor, ggml_type: int, in_features: int) -> torch.Tensor:
    """The tiles of a GGUF weight, uint8 [num_tiles(N), tile_bytes] from its rows of blocks, uint8 [N, row_bytes]
    (see the module docstring). ValueError on a wrong type or shape."""
    fmt = block_format(ggml_type)
    size = row_bytes(ggml_type, in_features)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != size:
        raise ValueError(f"{fmt.name} blocks of {in_features} features must be uint8 [N, {size}], got "
                         f"{blocks.dtype} {list(blocks.shape)}")
    out_features = blocks.shape[0]
    tiles = num_tiles(out_features)
    padded = F.pad(blocks, (0, 0, 0, tiles * TILE_ROWS - out_features))
    # [tile, super-block, row, block bytes]: each super-block's bytes of the 16 rows together
    grouped = padded.reshape(tiles, TILE_ROWS, -1, fmt.block_bytes).transpose(1, 2)
    meta, quants = _PACKERS[int(ggml_type)](grouped)
    packed = torch.cat([meta.flatten(2), quants.flatten(2)], dim=2)
    return packed.reshape(tiles, -1).contiguous()


def _pack_q8_0(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = b[..., 2:].reshape(*b.shape[:-1], 8, 4).transpose(-3, -2) ^ 0x80  # [.., g, r, i], q + 128
    return b[..., 0:2], q


def _pack_q4_0(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # A block's byte 4p + i already holds q[4p+i] (low) and q[16+4p+i] (high): only the rows interleave.
    return b[..., 0:2], b[..., 2:].reshape(*b.shape[:-1], 4, 4).transpose(-3, -2)


def _pack_q4_1(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    meta = torch.stack([b[..., 0:2], b[..., 2:4]], dim=-3)  # [.., d | m, r, 2]
    return meta, b[..., 4:].reshape(*b.shape[:-1], 4, 4).transpose(-3, -2)


def _pack_q4_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from radixlm.model.gguf_blocks import _q4_k_scales

    lead = b.shape[:-1]
    scales, mins = _q4_k_scales(b.reshape(-1, 144)[:, 4:16])
    scales, mins = scales.reshape(*lead, 8).transpose(-2, -1), mins.reshape(*lead, 8).transpose(-2, -1)
    meta = torch.cat([b[..., 0:2].flatten(-2), b[..., 2:4].flatten(-2), scales.flatten(-2), mins.flatten(-2)], -1)
    q = _q4_k_quants(b).transpose(-3, -2)  # [.., j, r, 32]
    return meta, _nibble_pairs(q)


def _pack_q6_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    meta = torch.cat([b[..., 208:210].flatten(-2), b[..., 192:208].transpose(-2, -1).flatten(-2)], -1)
    q = _q6_k_quants(b).transpose(-3, -2)  # [.., j, r, 32]
    low = _nibble_pairs(q & 0x0F)  # [.., j, 4, r, 4]
    high = (q >> 4).reshape(*q.shape[:-1], 8, 4).transpose(-3, -2)  # [.., j, g, r, i]
    high = high.reshape(*high.shape[:-3], 2, 4, TILE_ROWS, 4)  # g = 4h + c
    high = high[..., 0, :, :] | (high[..., 1, :, :] << 2) | (high[..., 2, :, :] << 4) | (high[..., 3, :, :] << 6)
    return meta, torch.cat([low.flatten(-3), high.flatten(-3)], dim=-1)


_PACKERS = {8: _pack_q8_0, 2: _pack_q4_0, 3: _pack_q4_1, 12: _pack_q4_k, 14: _pack_q6_k}
assert set(_PACKERS) == set(BLOCK_FORMATS) == set(TILE_FORMATS)


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """`x` [..., K] (K a multiple of 32) as the kernel sees it: each 32 values rounded to int8 steps of their
    absolute maximum / 127 (round half to even), returned dequantized (float32). A block whose maximum is zero, or so
    small that 127 / maximum overflows, becomes zeros; a block holding NaN or inf becomes NaN."""
    blocks = x.float().reshape(*x.shape[:-1], -1, K_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inverse = torch.full_like(amax, 127.0) / amax  # a true division (PyTorch's 127.0 / t multiplies by 1 / t)
    usable = torch.isfinite(inverse) & (amax > 0)
    q = torch.round(blocks * torch.where(usable, inverse, torch.zeros_like(inverse)))
    step = torch.where(usable, amax / torch.full_like(amax, 127.0), torch.zeros_like(amax))
    step = torch.where(torch.isfinite(amax), step, torch.full_like(amax, float("nan")))
    return (q * step).reshape(x.shape)
