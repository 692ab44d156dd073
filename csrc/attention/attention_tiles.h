// Register-tiled score and value phases of the paged decode kernel (paged_attention.cpp), for head_dim = 16 * kC.
// Included by that file only; the namespace keeps these names to it.
//
// A group of up to kG query heads that share a KV head keeps its query rows (scores) or output accumulators
// (values) in vector registers across the tile's positions, so each K/V row is loaded once per group from L1 and
// every accumulator update is an FMA on a register, not a load-FMA-store through memory.

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "bf16_vec.h"
#include "isa.h"
#include "vec16.h"

namespace radixlm_attention {

constexpr int64_t kTile = 64;  // positions scored before each softmax rescale

using radixlm_vec::load16;
using radixlm_vec::store16;
using radixlm_vec::v16f;

#if RADIXLM_VEC16_HALVES
inline __m256 widen8(const at::BFloat16* p) {  // bfloat16 is a float32's top half: zero-extend and shift (exact)
  const __m128i narrow = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(narrow), 16));
}

inline v16f load16(const at::BFloat16* p) { return {widen8(p), widen8(p + 8)}; }

inline v16f load16(const int8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)))};
}

// The lane sums of 4 vectors, each its own lanes in a fixed order whatever the other three hold: halves added, then
// two rounds of pairwise adds.
inline __m128 sum4(v16f p0, v16f p1, v16f p2, v16f p3) {
  const auto fold = [](v16f v) { return _mm256_add_ps(v.lo, v.hi); };
  const __m256 pairs01 = _mm256_hadd_ps(fold(p0), fold(p1));  // per 128-bit lane: p0's two pairs, p1's two
  const __m256 pairs23 = _mm256_hadd_ps(fold(p2), fold(p3));
  const __m256 quads = _mm256_hadd_ps(pairs01, pairs23);  // per 128-bit lane: each vector's sum of four
  return _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1));
}
#define RADIXLM_TILES_SUM4 1
#else
// bfloat16 widened exactly (bf16_vec.h: one zero-extending load and a shift with AVX-512).
inline v16f load16(const at::BFloat16* p) { return radixlm_bf16::load16(reinterpret_cast<const uint16_t*>(p)); }

// int8 widened by intrinsics: GCC 12 compiles __builtin_convertvector from int8 lanes into 16 scalar conversions
// (3.5x the bfloat16 kernel's time).
inline v16f load16(const int8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
#if RADIXLM_BUILD_AVX512
  return reinterpret_cast<v16f>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
#else
  v16f v;
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}
#endif

// Asks for one K/V row (one head of one position) ahead of its use, into L2.
template <typename scalar_t, int64_t kD>
inline void prefetch_row(const scalar_t* row) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t line = 0; line < kD * static_cast<int64_t>(sizeof(scalar_t)); line += 64) {
    __builtin_prefetch(bytes + line, 0, 2);
  }
}

#if RADIXLM_BUILD_AVX512
// The lane sums of 4 vectors, in order: a transposing tree of shuffles and adds (about 3.5 instructions a sum,
// against about 7 for each vector's own horizontal sum). Each sum adds its own vector's lanes in a fixed order,
// whatever the other three hold.
inline __m128 sum4(__m512 p0, __m512 p1, __m512 p2, __m512 p3) {
  // 128-bit lanes: [p0's 8 partial sums in two lanes, p1's in two]
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(p0, p1, 0x44), _mm512_shuffle_f32x4(p0, p1, 0xEE));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(p2, p3, 0x44), _mm512_shuffle_f32x4(p2, p3, 0xEE));
  // 128-bit lane k: vector k's 4 partial sums
  const __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
  const __m512 z = _mm512_add_ps(y, _mm512_permute_ps(y, 0x4E));
  const __m512 w = _mm512_add_ps(z, _mm512_permute_ps(z, 0xB1));  // every element of lane k: vector k's sum
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                          0, 0, 0), w));
}

#define RADIXLM_TILES_SUM4 1  // v16f is __m512's type here: score_group passes its parts as they are
#endif

// parts[g] = q_g * k, lane by lane, summed over the row's kC vectors: head g's dot product with K row k before its
// horizontal sum. The row is loaded once for the kG heads.
template <typename scalar_t, int64_t kC, int64_t kG>
inline void dot_parts(const v16f (&qv)[kG][kC], const scalar_t* k, v16f (&parts)[kG]) {
  v16f kv[kC];
  for (int64_t c = 0; c < kC; ++c) kv[c] = load16(k + 16 * c);
  for (int64_t g = 0; g < kG; ++g) {
    v16f part = qv[g][0] * kv[0];
    for (int64_t c = 1; c < kC; ++c) part += qv[g][c] * kv[c];
    parts[g] = part;
  }
}

// scores[(j0 + g) * kTile + i] = scale * q_{j0+g} . k_i for the tile's n positions of KV head h. Each K row is
// loaded once for the kG heads; with AVX-512 the dot products of 4 positions are summed together (sum4).
template <typename scalar_t, int64_t kC, int64_t kG>
inline void score_group(const float* q, const scalar_t* keys, const int64_t* rows, int64_t n, int64_t h, int64_t j0,
                        float scale, float* scores, const int64_t* next, int64_t num_next) {
  constexpr int64_t d = 16 * kC;
  v16f qv[kG][kC];
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t c = 0; c < kC; ++c) qv[g][c] = load16(q + (j0 + g) * d + 16 * c);
  }
#if RADIXLM_TILES_SUM4
  for (int64_t i0 = 0; i0 < n; i0 += 4) {  // kTile is a multiple of 4: the 4 scores always fit in the row
    v16f parts[4][kG];  // [position][head]
    for (int64_t t = 0; t < 4; ++t) {
      const int64_t i = i0 + t;
      if (i >= n) {
        for (int64_t g = 0; g < kG; ++g) parts[t][g] = v16f{};
        continue;
      }
      if (i < num_next) prefetch_row<scalar_t, d>(keys + next[i] + h * d);
      dot_parts<scalar_t, kC, kG>(qv, keys + rows[i] + h * d, parts[t]);
    }
    for (int64_t g = 0; g < kG; ++g) {
      const __m128 sums = sum4(parts[0][g], parts[1][g], parts[2][g], parts[3][g]);
      _mm_storeu_ps(scores + (j0 + g) * kTile + i0, _mm_mul_ps(sums, _mm_set1_ps(scale)));
    }
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    if (i < num_next) prefetch_row<scalar_t, d>(keys + next[i] + h * d);
    v16f parts[kG];
    dot_parts<scalar_t, kC, kG>(qv, keys + rows[i] + h * d, parts);
    for (int64_t g = 0; g < kG; ++g) scores[(j0 + g) * kTile + i] = radixlm_vec::hsum(parts[g]) * scale;
  }
#endif
}

// acc[j0 + g] += sum_i weight[(j0 + g), i] * v_i over the tile's n positions of KV head h.
template <typename scalar_t, int64_t kC, int64_t kG>
inline void value_group(float* acc, const scalar_t* values, const int64_t* rows, int64_t n, int64_t h, int64_t j0,
                        const float* weights, const int64_t* next, int64_t num_next) {
  constexpr int64_t d = 16 * kC;
  v16f av[kG][kC];
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t c = 0; c < kC; ++c) av[g][c] = load16(acc + (j0 + g) * d + 16 * c);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i < num_next) prefetch_row<scalar_t, d>(values + next[i] + h * d);
    const scalar_t* v = values + rows[i] + h * d;
    v16f vv[kC];
    for (int64_t c = 0; c < kC; ++c) vv[c] = load16(v + 16 * c);
    for (int64_t g = 0; g < kG; ++g) {
      const float w = weights[(j0 + g) * kTile + i];
      for (int64_t c = 0; c < kC; ++c) av[g][c] += w * vv[c];
    }
  }
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t c = 0; c < kC; ++c) store16(acc + (j0 + g) * d + 16 * c, av[g][c]);
  }
}

// Query heads per register group: kG * kC accumulators plus a row must fit in 32 vector registers (AVX-512). The
// AVX2 build's 16 registers hold 8 lanes each, so its groups are of 2 heads: at head_dim 64 and 128, 1.2-2x as fast
// as groups of 1 or 4 (Zen 4, the AVX2 build forced).
#if RADIXLM_BUILD_AVX512
template <int64_t kC>
constexpr int64_t kGroup = kC <= 4 ? 4 : 2;
#else
template <int64_t kC>
constexpr int64_t kGroup = 2;
#endif

// Runs `phase<kG>(j0)` over the query heads [j_begin, j_end) in groups of at most kGroup<kC>.
template <int64_t kC, typename Phase>
inline void for_groups(int64_t j_begin, int64_t j_end, Phase&& phase) {
  int64_t j = j_begin;
  for (; j + kGroup<kC> <= j_end; j += kGroup<kC>) phase(std::integral_constant<int64_t, kGroup<kC>>{}, j);
  switch (j_end - j) {
    case 0: break;
    case 1: phase(std::integral_constant<int64_t, 1>{}, j); break;
    case 2: phase(std::integral_constant<int64_t, 2>{}, j); break;
    default: phase(std::integral_constant<int64_t, 3>{}, j); break;
  }
}

}  // namespace radixlm_attention
