// The GGUF linear's portable kernels (gguf_kernels.h): plain loops over a tile's K-blocks, each unpacked into bytes
// and floats first, then multiplied in int32 with every activation row. They run where the CPU has neither AVX2 nor
// AVX-512, and they are the statement of the arithmetic the vector kernels repeat operation for operation (the
// tests hold them bit-identical): per K-block b and output column c,
//   acc = fma(float(dot), scale[c] * step[b], acc), then acc = fma(offset[c], sum32[b], acc)
// with dot the int32 sum of the block's stored quants times the activation bytes, and finally acc + bias[c]. Q8_0
// takes its offset (its quants are stored as q + 128) back in int32 instead, one float operation fewer a block:
//   acc = fma(float(dot + offset32[b]), scale[c] * step[b], acc).
// Q6_K sums each 16-weight half on its own (each has its scale), takes its offset (q - 32) back in int32 too, and
// applies the step once for both halves:
//   acc = fma(fma(float(high + offset16[b][1]), scale1[c], float(low + offset16[b][0]) * scale0[c]), step[b], acc).
//
// Also here: a tile row dequantized with the operations of radixlm.model.gguf_blocks.dequantize (embeddings).

#include <c10/util/Half.h>

#include <cmath>
#include <cstring>

#include "gguf_kernels.h"

namespace radixlm_gguf {
namespace {

inline float half_at(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(load_u16(p)); }

// One K-block of a tile: for each of the 16 rows, its 32 stored quants (unsigned bytes, as vpdpbusd takes them), the
// scale of each 16-weight half (the same for both halves but in Q6_K) and the offset the float path applies (Q4_0,
// Q4_1, Q4_K; Q8_0's and Q6_K's come back in int32).
struct KBlock {
  uint8_t q[kTileRows][kBlock];
  float scale[kTileRows][2], offset[kTileRows];
};

// Quants of 4-bit layouts: vector p, byte 4r + i holds q[r][4p+i] (low nibble) and q[r][16+4p+i] (high).
void unpack_nibbles(const uint8_t* quants, KBlock& u) {
  for (int p = 0; p < 4; ++p) {
    for (int r = 0; r < kTileRows; ++r) {
      for (int i = 0; i < 4; ++i) {
        const uint8_t byte = quants[64 * p + 4 * r + i];
        u.q[r][4 * p + i] = byte & 15;
        u.q[r][16 + 4 * p + i] = byte >> 4;
      }
    }
  }
}

void set_scales(KBlock& u, int r, float scale, float offset) {
  u.scale[r][0] = u.scale[r][1] = scale;
  u.offset[r] = offset;
}

// K-block j of the super-block at `super`.
void unpack_q8_0(const uint8_t* super, int, KBlock& u) {
  for (int g = 0; g < 8; ++g) {
    for (int r = 0; r < kTileRows; ++r) std::memcpy(&u.q[r][4 * g], super + 32 + 64 * g + 4 * r, 4);
  }
  for (int r = 0; r < kTileRows; ++r) {
    const float d = half_at(super + 2 * r);
    set_scales(u, r, d, 0.f);  // the quants are stored as q + 128: the kernel takes 128 x sum(x) back in int32
  }
}

void unpack_q4_0(const uint8_t* super, int, KBlock& u) {
  unpack_nibbles(super + 32, u);
  for (int r = 0; r < kTileRows; ++r) {
    const float d = half_at(super + 2 * r);
    set_scales(u, r, d, -8.f * d);
  }
}

void unpack_q4_1(const uint8_t* super, int, KBlock& u) {
  unpack_nibbles(super + 64, u);
  for (int r = 0; r < kTileRows; ++r) set_scales(u, r, half_at(super + 2 * r), half_at(super + 32 + 2 * r));
}

void unpack_q4_k(const uint8_t* super, int j, KBlock& u) {
  unpack_nibbles(super + 320 + 256 * j, u);
  for (int r = 0; r < kTileRows; ++r) {
    const float scale = half_at(super + 2 * r) * static_cast<float>(super[64 + 16 * j + r]);
    const float offset = half_at(super + 32 + 2 * r) * static_cast<float>(super[192 + 16 * j + r]);
    set_scales(u, r, scale, -offset);
  }
}

void unpack_q6_k(const uint8_t* super, int j, KBlock& u) {
  const uint8_t* quants = super + 288 + 384 * j;
  unpack_nibbles(quants, u);
  for (int h = 0; h < 2; ++h) {  // vector h, bits 2c, 2c + 1: the high bits of group 4h + c
    for (int r = 0; r < kTileRows; ++r) {
      for (int i = 0; i < 4; ++i) {
        const uint8_t byte = quants[256 + 64 * h + 4 * r + i];
        for (int c = 0; c < 4; ++c) u.q[r][4 * (4 * h + c) + i] |= ((byte >> (2 * c)) & 3) << 4;
      }
    }
  }
  for (int r = 0; r < kTileRows; ++r) {
    const float d = half_at(super + 2 * r);
    for (int h = 0; h < 2; ++h) {
      const float scale = d * static_cast<float>(static_cast<int8_t>(super[32 + 16 * (2 * j + h) + r]));
      u.scale[r][h] = scale;
    }
  }
}

using Unpack = void (*)(const uint8_t* super, int j, KBlock& u);

// kIntOffset: the offset is taken back from dot in int32 (Q8_0; Q6_K's halves always), else applied in float against
// sum32.
template <Unpack kUnpack, int64_t kSuperWeights, int64_t kSuperBytes, bool kHalves, bool kIntOffset = false>
void tile_kernel(const uint8_t* tile, const Activations& x, int64_t m0, int64_t rows, float* out, int64_t ld_out,
                 int64_t cols, const float* bias, bool accumulate) {
  constexpr int64_t kPerSuper = kSuperWeights / kBlock;
  const int64_t blocks = x.k / kBlock;
  float acc[8][kTileRows] = {};  // rows <= 8 (linear_gguf.cpp's chunks)
  for (int64_t r = 0; accumulate && r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) acc[r][c] = out[(m0 + r) * ld_out + c];
  }
  KBlock u;
  for (int64_t b = 0; b < blocks; ++b) {
    kUnpack(tile + b / kPerSuper * kSuperBytes, static_cast<int>(b % kPerSuper), u);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m = m0 + r;
      const int8_t* xq = x.q + (m * x.row_blocks + b) * kBlock;
      const float step = x.step[m * x.row_blocks + b];
      for (int c = 0; c < kTileRows; ++c) {
        int32_t low = 0, high = 0;
        for (int i = 0; i < 16; ++i) low += u.q[c][i] * xq[i];
        for (int i = 16; i < 32; ++i) high += u.q[c][i] * xq[i];
        float a = acc[r][c];
        if (kHalves) {
          const int32_t* offset16 = x.offset16 + 2 * (m * x.row_blocks + b);
          const float halves = std::fma(static_cast<float>(high + offset16[1]), u.scale[c][1],
                                        static_cast<float>(low + offset16[0]) * u.scale[c][0]);
          a = std::fma(halves, step, a);
        } else if (kIntOffset) {
          const float scale = u.scale[c][0] * step;
          a = std::fma(static_cast<float>(low + high + x.offset32[m * x.row_blocks + b]), scale, a);
        } else {
          const float scale = u.scale[c][0] * step;
          a = std::fma(static_cast<float>(low + high), scale, a);
          a = std::fma(u.offset[c], x.sum32[m * x.row_blocks + b], a);
        }
        acc[r][c] = a;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[(m0 + r) * ld_out + c] = bias ? acc[r][c] + bias[c] : acc[r][c];
  }
}

// The reference's float operations, each rounded on its own (no contraction into a fused multiply-add).
__attribute__((optimize("fp-contract=off"))) void dequantize_row(int64_t type, const uint8_t* tile, int64_t k,
                                                                  int64_t row, float* out) {
  KBlock u;
  for (int64_t b = 0; b < k / kBlock; ++b, out += kBlock) {
    switch (type) {
      case kQ8_0: {
        const uint8_t* super = tile + b * 544;
        unpack_q8_0(super, 0, u);
        const float d = half_at(super + 2 * row);
        for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(static_cast<int8_t>(u.q[row][i] ^ 0x80)) * d;
        break;
      }
      case kQ4_0: {
        const uint8_t* super = tile + b * 288;
        unpack_q4_0(super, 0, u);
        const float d = half_at(super + 2 * row);
        for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(u.q[row][i] - 8) * d;
        break;
      }
      case kQ4_1: {
        const uint8_t* super = tile + b * 320;
        unpack_q4_1(super, 0, u);
        for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(u.q[row][i]) * u.scale[row][0] + u.offset[row];
        break;
      }
      case kQ4_K: {  // (d scale) q - (dmin min)
        unpack_q4_k(tile + b / 8 * 2368, static_cast<int>(b % 8), u);
        for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(u.q[row][i]) * u.scale[row][0] + u.offset[row];
        break;
      }
      default: {  // Q6_K: (d scale) (q - 32)
        unpack_q6_k(tile + b / 8 * 3360, static_cast<int>(b % 8), u);
        for (int i = 0; i < 32; ++i) out[i] = u.scale[row][i / 16] * static_cast<float>(u.q[row][i] - 32);
        break;
      }
    }
  }
}

}  // namespace

TileKernel portable_kernel(int64_t type) {
  switch (type) {
    case kQ8_0: return tile_kernel<unpack_q8_0, 32, 544, false, true>;
    case kQ4_0: return tile_kernel<unpack_q4_0, 32, 288, false>;
    case kQ4_1: return tile_kernel<unpack_q4_1, 32, 320, false>;
    case kQ4_K: return tile_kernel<unpack_q4_k, 256, 2368, false>;
    case kQ6_K: return tile_kernel<unpack_q6_k, 256, 3360, true>;
    default: return nullptr;
  }
}

void dequantize_tile_row(int64_t type, const uint8_t* tile, int64_t k, int64_t row, float* out) {
  dequantize_row(type, tile, k, row, out);
}

}  // namespace radixlm_gguf
