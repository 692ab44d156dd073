// The paged decode kernel's score and value phases on AVX-512's bfloat16 dot product (vdpbf16ps), for a bfloat16
// model's queries over a bfloat16 cache and head_dim = 32 * kP. Included by attention_item.h only.
//
// Each instruction multiplies 32 bfloat16 pairs and adds them into 16 float32 lanes, so a K or V row is read as it
// is stored (no widening) and each product costs half an FMA of the float32 phases (attention_tiles.h). Scores:
// the query (bfloat16 values, so its bfloat16 copy is exact) against each K row, the products exact, the sum in a
// different order than the float32 phase's. Values: the softmax weights rounded to bfloat16 (as the prefill kernel
// and GPU flash attention do), two positions per instruction, V rows of a pair interleaved element by element; the
// accumulators hold their head_dim lanes in that interleaved order between the tile's load and store.
//
// Either phase depends only on the row's own query, context and tiles, never on other rows of the step: a request
// gets the same numbers in any batch.

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <type_traits>

#include "attention_tiles.h"
#include "isa.h"

#if RADIXLM_BUILD_AVX512_BF16

namespace radixlm_attention {

// Whether the dot-product phases serve a cache of scalar_t with head_dim kD (0: head_dim known only at run time).
template <typename scalar_t, int64_t kD>
constexpr bool kDotTiles = std::is_same_v<scalar_t, at::BFloat16> && kD > 0 && kD % 32 == 0;

inline __m512bh as_bf16_pairs(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// 32 bfloat16 from two float32 vectors, in order (exact for values that are bfloat16 already).
inline __m512bh to_bf16_32(const float* p) {
  return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
}

// The dot-product form of `score_group`: the same scores, summed in another order.
template <int64_t kC, int64_t kG>
inline void score_group_dot(const float* q, const at::BFloat16* keys, const int64_t* rows, int64_t n, int64_t h,
                            int64_t j0, float scale, float* scores, const int64_t* next, int64_t num_next) {
  constexpr int64_t d = 16 * kC, kP = kC / 2;
  __m512bh qv[kG][kP];
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t c = 0; c < kP; ++c) qv[g][c] = to_bf16_32(q + (j0 + g) * d + 32 * c);
  }
  for (int64_t i0 = 0; i0 < n; i0 += 4) {  // kTile is a multiple of 4: the 4 scores always fit in the row
    __m512 parts[4][kG];  // [position][head]
    for (int64_t t = 0; t < 4; ++t) {
      const int64_t i = i0 + t;
      if (i >= n) {
        for (int64_t g = 0; g < kG; ++g) parts[t][g] = _mm512_setzero_ps();
        continue;
      }
      if (i < num_next) prefetch_row<at::BFloat16, d>(keys + next[i] + h * d);
      const at::BFloat16* k = keys + rows[i] + h * d;
      __m512bh kv[kP];
      for (int64_t c = 0; c < kP; ++c) kv[c] = as_bf16_pairs(_mm512_loadu_si512(k + 32 * c));
      for (int64_t g = 0; g < kG; ++g) {
        __m512 part = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[g][0], kv[0]);
        for (int64_t c = 1; c < kP; ++c) part = _mm512_dpbf16_ps(part, qv[g][c], kv[c]);
        parts[t][g] = part;
      }
    }
    for (int64_t g = 0; g < kG; ++g) {
      const __m128 sums = sum4(parts[0][g], parts[1][g], parts[2][g], parts[3][g]);
      _mm_storeu_ps(scores + (j0 + g) * kTile + i0, _mm_mul_ps(sums, _mm_set1_ps(scale)));
    }
  }
}

// Lane orders of the interleaved accumulators: `_mm512_unpacklo_epi16` of two rows' 32 elements [32c, 32c + 32)
// pairs elements 8L + m (L a 128-bit lane, m < 4), `unpackhi` elements 8L + 4 + m, so the low accumulator's lane
// 4L + m holds element 8L + m and the high one's element 8L + 4 + m. These pick them from the natural order
// (two vectors of 16) and back.
inline __m512i to_low_lanes() { return _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27); }
inline __m512i to_high_lanes() { return _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31); }
inline __m512i to_first_half() { return _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23); }
inline __m512i to_second_half() {
  return _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
}

// The dot-product form of `value_group`: acc[j0 + g] += sum_i weight[(j0 + g), i] * v_i over the tile's n
// positions of KV head h, two positions per instruction (an odd last one paired with zeros).
template <int64_t kC, int64_t kG>
inline void value_group_dot(float* acc, const at::BFloat16* values, const int64_t* rows, int64_t n, int64_t h,
                            int64_t j0, const float* weights, const int64_t* next, int64_t num_next) {
  constexpr int64_t d = 16 * kC, kP = kC / 2;
  __m512 low[kG][kP], high[kG][kP];
  alignas(64) uint32_t pairs[kG][kTile / 2];  // head g's weights of positions (2t, 2t + 1) as two bfloat16
  for (int64_t g = 0; g < kG; ++g) {
    const float* a = acc + (j0 + g) * d;
    for (int64_t c = 0; c < kP; ++c) {
      const __m512 first = _mm512_loadu_ps(a + 32 * c), second = _mm512_loadu_ps(a + 32 * c + 16);
      low[g][c] = _mm512_permutex2var_ps(first, to_low_lanes(), second);
      high[g][c] = _mm512_permutex2var_ps(first, to_high_lanes(), second);
    }
    // Lanes past n: the softmax left zeros up to the end of their 16-lane vector, so a pair never reads past it.
    for (int64_t i = 0; i < n; i += 32) {
      _mm512_store_si512(pairs[g] + i / 2, reinterpret_cast<__m512i>(to_bf16_32(weights + (j0 + g) * kTile + i)));
    }
  }
  for (int64_t i = 0; i < n; i += 2) {
    if (i < num_next) prefetch_row<at::BFloat16, d>(values + next[i] + h * d);
    if (i + 1 < num_next) prefetch_row<at::BFloat16, d>(values + next[i + 1] + h * d);
    const at::BFloat16* v0 = values + rows[i] + h * d;
    const at::BFloat16* v1 = i + 1 < n ? values + rows[i + 1] + h * d : nullptr;
    __m512bh lo[kP], hi[kP];
    for (int64_t c = 0; c < kP; ++c) {
      const __m512i a = _mm512_loadu_si512(v0 + 32 * c);
      const __m512i b = v1 != nullptr ? _mm512_loadu_si512(v1 + 32 * c) : _mm512_setzero_si512();
      lo[c] = as_bf16_pairs(_mm512_unpacklo_epi16(a, b));
      hi[c] = as_bf16_pairs(_mm512_unpackhi_epi16(a, b));
    }
    for (int64_t g = 0; g < kG; ++g) {
      const __m512bh w = as_bf16_pairs(_mm512_set1_epi32(static_cast<int>(pairs[g][i / 2])));
      for (int64_t c = 0; c < kP; ++c) {
        low[g][c] = _mm512_dpbf16_ps(low[g][c], w, lo[c]);
        high[g][c] = _mm512_dpbf16_ps(high[g][c], w, hi[c]);
      }
    }
  }
  for (int64_t g = 0; g < kG; ++g) {
    float* a = acc + (j0 + g) * d;
    for (int64_t c = 0; c < kP; ++c) {
      _mm512_storeu_ps(a + 32 * c, _mm512_permutex2var_ps(low[g][c], to_first_half(), high[g][c]));
      _mm512_storeu_ps(a + 32 * c + 16, _mm512_permutex2var_ps(low[g][c], to_second_half(), high[g][c]));
    }
  }
}

}  // namespace radixlm_attention

#endif  // RADIXLM_BUILD_AVX512_BF16
