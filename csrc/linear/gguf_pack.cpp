// A GGUF weight's rows of blocks regrouped into the GGUF kernel's tiles, once at load. radixlm/model/gguf_tiles.py's
// pack_tiles (pure torch; its module docstring draws the layout) is the reference: the same bytes, in one pass over
// the blocks instead of a dozen tensor operations (each regrouping of a 1B model's weights took seconds there).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "gguf_kernels.h"
#include "kernel_checks.h"
#include "linear_gguf.h"

namespace radixlm_gguf {
namespace {

constexpr int64_t kMaxBlockBytes = 210;  // Q6_K's

// Bytes of one of the file's blocks (a super-block: 32 weights for Q8_0 / Q4_0 / Q4_1, 256 for Q4_K / Q6_K).
int64_t file_block_bytes(int64_t type) {
  switch (type) {
    case kQ8_0: return 34;
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ4_K: return 144;
    case kQ6_K: return 210;
    default: break;
  }
  TORCH_CHECK(false, "gguf_pack_tiles: ggml type ", type,
              " is not supported (Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14)");
}

// Each pack_* writes one super-block of the tile's 16 rows (row r's block at b[r]) at `out`, in the order of
// gguf_tiles' _pack_*: the metadata row by row, then the K-blocks' quants.

// `count` two-byte fields at `offset` of each row's block: field k of every row, then field k + 1.
uint8_t* copy_fields(const uint8_t* const* b, int64_t offset, int count, uint8_t* out) {
  for (int k = 0; k < count; ++k) {
    for (int64_t r = 0; r < kTileRows; ++r) {
      *out++ = b[r][offset + 2 * k];
      *out++ = b[r][offset + 2 * k + 1];
    }
  }
  return out;
}

// Quant bytes in groups of 4 (`first`: the block's first quant byte): group p, row r, byte i = quant byte 4p + i, its
// bits flipped by `flip` (Q8_0's q -> q + 128).
void interleave_groups(const uint8_t* const* b, int64_t first, int groups, uint8_t flip, uint8_t* out) {
  for (int p = 0; p < groups; ++p) {
    for (int64_t r = 0; r < kTileRows; ++r) {
      for (int i = 0; i < 4; ++i) *out++ = b[r][first + 4 * p + i] ^ flip;
    }
  }
}

// Q4_K's 6-bit scales and mins (gguf_blocks._q4_k_scales) from a block's 12 packed bytes.
void q4_k_scales(const uint8_t* packed, uint8_t* scales, uint8_t* mins) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = packed[j] & 0x3F;
    mins[j] = packed[4 + j] & 0x3F;
    scales[4 + j] = (packed[8 + j] & 0x0F) | ((packed[j] >> 2) & 0x30);
    mins[4 + j] = (packed[8 + j] >> 4) | ((packed[4 + j] >> 2) & 0x30);
  }
}

// Quant e (< 32) of sub-block j (< 8) of a Q4_K block: 0-15.
inline uint8_t q4_k_quant(const uint8_t* block, int j, int e) {
  return (block[16 + 32 * (j / 2) + e] >> (4 * (j % 2))) & 0x0F;
}

// Quant e of sub-block j of a Q6_K block: 0-63 (the low 4 bits from ql, the high 2 from qh).
inline uint8_t q6_k_quant(const uint8_t* block, int j, int e) {
  const int half = j / 4, s = j % 4;
  const uint8_t low = (block[64 * half + 32 * (s % 2) + e] >> (4 * (s / 2))) & 0x0F;
  const uint8_t high = (block[128 + 32 * half + e] >> (2 * s)) & 0x03;
  return low | static_cast<uint8_t>(high << 4);
}

// The low 4 bits of a K-block's quants as pairs: vector p, row r, byte i = quant 4p + i (low nibble) and 16 + 4p + i
// (high nibble).
template <class Quant>
uint8_t* nibble_pairs(Quant quant, uint8_t* out) {
  for (int p = 0; p < 4; ++p) {
    for (int64_t r = 0; r < kTileRows; ++r) {
      for (int i = 0; i < 4; ++i) {
        *out++ = (quant(r, 4 * p + i) & 0x0F) | static_cast<uint8_t>((quant(r, 16 + 4 * p + i) & 0x0F) << 4);
      }
    }
  }
  return out;
}

void pack_q4_k(const uint8_t* const* b, uint8_t* out) {
  out = copy_fields(b, 0, 2, out);  // d, then dmin
  uint8_t scales[kTileRows][8], mins[kTileRows][8];
  for (int64_t r = 0; r < kTileRows; ++r) q4_k_scales(b[r] + 4, scales[r], mins[r]);
  for (int j = 0; j < 8; ++j) {
    for (int64_t r = 0; r < kTileRows; ++r) *out++ = scales[r][j];
  }
  for (int j = 0; j < 8; ++j) {
    for (int64_t r = 0; r < kTileRows; ++r) *out++ = mins[r][j];
  }
  for (int j = 0; j < 8; ++j) {
    out = nibble_pairs([&](int64_t r, int e) { return q4_k_quant(b[r], j, e); }, out);
  }
}

void pack_q6_k(const uint8_t* const* b, uint8_t* out) {
  out = copy_fields(b, 208, 1, out);  // d
  for (int k = 0; k < 16; ++k) {
    for (int64_t r = 0; r < kTileRows; ++r) *out++ = b[r][192 + k];  // scale k of each row
  }
  for (int j = 0; j < 8; ++j) {
    uint8_t quants[kTileRows][32];  // each unpacked once: its low bits and its high bits go to different vectors
    for (int64_t r = 0; r < kTileRows; ++r) {
      for (int e = 0; e < 32; ++e) quants[r][e] = q6_k_quant(b[r], j, e);
    }
    const auto quant = [&](int64_t r, int e) { return quants[r][e]; };
    out = nibble_pairs(quant, out);
    // The high 2 bits: vector h, row r, byte i holds those of quants 4(4h + c) + i in bits 2c, 2c + 1.
    for (int h = 0; h < 2; ++h) {
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int i = 0; i < 4; ++i) {
          uint8_t byte = 0;
          for (int c = 0; c < 4; ++c) byte |= static_cast<uint8_t>((quant(r, 4 * (4 * h + c) + i) >> 4) << (2 * c));
          *out++ = byte;
        }
      }
    }
  }
}

void pack_super_block(int64_t type, const uint8_t* const* b, uint8_t* out) {
  switch (type) {
    case kQ8_0: return interleave_groups(b, 2, 8, 0x80, copy_fields(b, 0, 1, out));
    case kQ4_0: return interleave_groups(b, 2, 4, 0, copy_fields(b, 0, 1, out));
    case kQ4_1: return interleave_groups(b, 4, 4, 0, copy_fields(b, 0, 2, out));
    case kQ4_K: return pack_q4_k(b, out);
    default: return pack_q6_k(b, out);
  }
}

}  // namespace
}  // namespace radixlm_gguf

void radixlm::gguf_pack_tiles(const at::Tensor& rows, int64_t type, int64_t in_features, at::Tensor& out) {
  using namespace radixlm_gguf;
  const int64_t block_bytes = file_block_bytes(type);  // checks `type`: every type with file blocks has tiles
  const TileFormat* format = find_tile_format(type);
  TORCH_CHECK(in_features > 0 && in_features % format->super_weights == 0, "gguf_pack_tiles: ", format->name,
              " rows hold a positive multiple of ", format->super_weights, " weights, got ", in_features);
  const int64_t supers = in_features / format->super_weights, row_bytes = supers * block_bytes;
  radixlm::check_dense_cpu(rows, "rows");
  TORCH_CHECK(rows.scalar_type() == at::kByte && rows.dim() == 2 && rows.size(0) > 0 && rows.size(1) == row_bytes &&
                  rows.is_contiguous(),
              "gguf_pack_tiles: rows must be contiguous uint8 [N > 0, ", row_bytes, "], got ", rows.scalar_type(), " ",
              rows.sizes());
  const int64_t num_rows = rows.size(0), num_tiles = (num_rows + kTileRows - 1) / kTileRows;
  const int64_t super_bytes = format->super_bytes(), tile_bytes = supers * super_bytes;
  radixlm::check_dense_cpu(out, "out");
  TORCH_CHECK(out.scalar_type() == at::kByte && out.is_contiguous() &&
                  out.sizes() == at::IntArrayRef({num_tiles, tile_bytes}),
              "gguf_pack_tiles: out must be contiguous uint8 [", num_tiles, ", ", tile_bytes, "], got ",
              out.scalar_type(), " ", out.sizes());
  const uint8_t* src = rows.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  static const uint8_t zeros[kMaxBlockBytes] = {};  // the blocks of rows past the last (gguf_tiles pads with zeros)
  at::parallel_for(0, num_tiles, 1, [&](int64_t first, int64_t last) {
    const uint8_t* b[kTileRows];
    for (int64_t t = first; t < last; ++t) {
      for (int64_t s = 0; s < supers; ++s) {
        for (int64_t r = 0; r < kTileRows; ++r) {
          const int64_t row = t * kTileRows + r;
          b[r] = row < num_rows ? src + row * row_bytes + s * block_bytes : zeros;
        }
        pack_super_block(type, b, dst + t * tile_bytes + s * super_bytes);
      }
    }
  });
}
