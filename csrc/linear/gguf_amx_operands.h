// The GGUF linear's AMX path, its B operands (gguf_amx.cpp's header comment has the layout): a K-block of a GGUF tile
// (16 features, 32 weights each) dequantized to bfloat16, line j of the operand holding each feature's weights j and
// 16 + j as a pair, the features as lanes. Each format's float operations are those of
// radixlm.model.gguf_blocks.dequantize up to fused multiply-adds; the values are then rounded to bfloat16 once.
// Internal linkage: include from gguf_amx.cpp only.
#pragma once

#include <cstdint>

#include "../isa.h"
#include "gguf_kernels.h"
#include "gguf_vec512.h"

namespace radixlm_gguf {
namespace {

constexpr int64_t kOperandWords = 16 * 16;  // 32-bit words of one operand tile (1 KiB)

// Word j of the result holds 16-bit values j and 16 + j of `v`: the pairing of every K-block (see the header).
RADIXLM_AMX inline __m512i pair_halves(__m512i v) {
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                         6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(index, v);
}

// Line j of a B operand: lane f the bfloat16 pair (lo[f], hi[f]).
RADIXLM_AMX inline void store_line(uint32_t* line, __m512 lo, __m512 hi) {
  _mm512_storeu_si512(line, pair_halves(reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo))));
}

// A K-block of a 4-bit layout (quants: vector p, lane f's byte i holds weight 4p + i of feature f in its low nibble
// and 16 + 4p + i in its high one) as q * scale + offset, features as lanes.
RADIXLM_AMX void nibble_block(const uint8_t* quants, __m512 scale, __m512 offset, uint32_t* b) {
  const __m512i low4 = _mm512_set1_epi32(15);
  for (int p = 0; p < 4; ++p) {
    const __m512i v = _mm512_loadu_si512(quants + 64 * p);
    for (int i = 0; i < 4; ++i) {
      const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(v, 8 * i), low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 8 * i + 4), low4);
      store_line(b + (4 * p + i) * 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), scale, offset),
                 _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), scale, offset));
    }
  }
}

// Q8_0 (vector g, byte i: weight 4g + i stored as q + 128), Q6_K (nibbles as above, then two vectors of 2-bit high
// parts: vector h, bits 2c of byte i belong to weight 4(4h + c) + i; the value (q - 32) times its half's scale).
RADIXLM_AMX void q8_0_block(const uint8_t* super, uint32_t* b) {
  const __m512 d = halves16(super);
  const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
  for (int g = 0; g < 4; ++g) {
    const __m512i lo_v = _mm512_xor_si512(_mm512_loadu_si512(super + 32 + 64 * g), flip);
    const __m512i hi_v = _mm512_xor_si512(_mm512_loadu_si512(super + 32 + 64 * (g + 4)), flip);
    for (int i = 0; i < 4; ++i) {
      const __m512i lo = _mm512_srai_epi32(_mm512_slli_epi32(lo_v, 24 - 8 * i), 24);
      const __m512i hi = _mm512_srai_epi32(_mm512_slli_epi32(hi_v, 24 - 8 * i), 24);
      store_line(b + (4 * g + i) * 16, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d),
                 _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
    }
  }
}

// Byte i of each 32-bit lane of v, as an int32 lane.
RADIXLM_AMX inline __m512i byte_lanes(__m512i v, int i) {
  if (i == 3) return _mm512_srli_epi32(v, 24);
  return _mm512_and_si512(i == 0 ? v : _mm512_srli_epi32(v, 8 * i), _mm512_set1_epi32(0xFF));
}

// Bits 2p and 2p + 1 of each byte of `high` moved to its bits 4 and 5 (the rest cleared).
RADIXLM_AMX inline __m512i high_bits(__m512i high, int p) {
  const __m512i moved = p < 2 ? _mm512_slli_epi32(high, 4 - 2 * p) : _mm512_srli_epi32(high, 2 * p - 4);
  return _mm512_and_si512(moved, _mm512_set1_epi32(0x30303030));
}

// Each byte's 6-bit quant put together once a vector (its nibble, and its two high bits from `high` moved to bits 4
// and 5), then taken apart byte by byte; (q - 32) scale as one fused multiply-add with -32 scale, which is exact.
RADIXLM_AMX void q6_k_block(const uint8_t* super, int j, uint32_t* b) {
  const __m512 d = halves16(super);
  const __m512 scale0 = _mm512_mul_ps(d, bytes16(super + 32 + 16 * (2 * j), true));
  const __m512 scale1 = _mm512_mul_ps(d, bytes16(super + 32 + 16 * (2 * j + 1), true));
  const __m512 offset0 = _mm512_mul_ps(scale0, _mm512_set1_ps(-32.f));
  const __m512 offset1 = _mm512_mul_ps(scale1, _mm512_set1_ps(-32.f));
  const uint8_t* quants = super + 288 + 384 * j;
  const __m512i high0 = _mm512_loadu_si512(quants + 256), high1 = _mm512_loadu_si512(quants + 320);
  const __m512i nibbles = _mm512_set1_epi32(0x0F0F0F0F);
  for (int p = 0; p < 4; ++p) {  // vector p: weights 4p + i (low nibbles, high bits 2p of high0) and 16 + 4p + i
    const __m512i v = _mm512_loadu_si512(quants + 64 * p);
    const __m512i low = _mm512_or_si512(_mm512_and_si512(v, nibbles), high_bits(high0, p));
    const __m512i high = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(v, 4), nibbles), high_bits(high1, p));
    for (int i = 0; i < 4; ++i) {
      store_line(b + (4 * p + i) * 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(byte_lanes(low, i)), scale0, offset0),
                 _mm512_fmadd_ps(_mm512_cvtepi32_ps(byte_lanes(high, i)), scale1, offset1));
    }
  }
}

// K-block kb of a tile as a B operand (kOperandWords words at b). Not inlined into the product loops: the build that
// inlined it ran Q6_K's 256-row products at 1,108-1,153 GOP/s against 1,722-1,783 (a noisy machine; two sittings).
__attribute__((noinline)) RADIXLM_AMX void dequantize_block(int64_t type, const uint8_t* tile, int64_t kb,
                                                            uint32_t* b) {
  switch (type) {
    case kQ8_0: q8_0_block(tile + kb * 544, b); break;
    case kQ4_0: {
      const uint8_t* super = tile + kb * 288;
      const __m512 d = halves16(super);
      nibble_block(super + 32, d, _mm512_mul_ps(d, _mm512_set1_ps(-8.f)), b);
      break;
    }
    case kQ4_1: {
      const uint8_t* super = tile + kb * 320;
      nibble_block(super + 64, halves16(super), halves16(super + 32), b);
      break;
    }
    case kQ4_K: {  // (d scale) q - (dmin min)
      const uint8_t* super = tile + kb / 8 * 2368;
      const int j = static_cast<int>(kb % 8);
      const __m512 scale = _mm512_mul_ps(halves16(super), bytes16(super + 64 + 16 * j, false));
      const __m512 offset = _mm512_mul_ps(halves16(super + 32), bytes16(super + 192 + 16 * j, false));
      nibble_block(super + 320 + 256 * j, scale, negate(offset), b);
      break;
    }
    default: q6_k_block(tile + kb / 8 * 3360, static_cast<int>(kb % 8), b); break;
  }
}

}  // namespace
}  // namespace radixlm_gguf
