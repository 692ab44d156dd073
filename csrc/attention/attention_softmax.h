// The softmax phase of the paged decode kernel (paged_attention.cpp): the online softmax of a tile (exp from
// exp_nonpositive.h), and the merge of a row's partial records. Included by that file only; the namespace keeps these
// names to it.

#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "attention_plan.h"
#include "attention_tiles.h"
#include "exp_nonpositive.h"
#include "isa.h"

namespace radixlm_attention {

using radixlm::exp_nonpositive;
#if RADIXLM_BUILD_AVX512
using radixlm::exp16_nonpositive;
#endif

// Soft-caps one head's logits of a tile: s = tanh(s / softcap) * softcap.
inline void soft_cap(float* s, int64_t n, float softcap) {
  for (int64_t i = 0; i < n; ++i) s[i] = std::tanh(s[i] / softcap) * softcap;
}

#if RADIXLM_VEC16_HALVES
using radixlm::exp8_nonpositive;

// s[i] = exp(s[i] - max) for i < n, returning their sum: 8 lanes at a time with exp8_nonpositive, the last n % 8 one
// by one. GCC 12 leaves softmax_tile's `omp simd` loop over the scalar exp unvectorised in the AVX2 build (a third of
// the decode kernel's time on a Zen 3).
inline float exp_tile8(float* __restrict s, int64_t n, float max) {
  const __m256 top = _mm256_set1_ps(max);
  __m256 total = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + i), top));
    _mm256_storeu_ps(s + i, w);
    total = _mm256_add_ps(total, w);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float sum = 0.f;
  for (const float lane : lanes) sum += lane;
  for (; i < n; ++i) {
    s[i] = exp_nonpositive(s[i] - max);
    sum += s[i];
  }
  return sum;
}
#endif

// Turns one tile of logits `s[0..n)` of one query head into weights against the running max and sum (soft-capping
// them first when softcap > 0), and rescales that head's accumulated output `acc[0..d)` to the new max. The plain
// loops, for a head_dim that is not a multiple of 16 or a host without AVX-512 (else `softmax_heads`).
inline void softmax_tile(float* __restrict s, int64_t n, float softcap, float& running_max, float& running_sum,
                         float* __restrict acc, int64_t d) {
  if (softcap > 0.f) soft_cap(s, n, softcap);
  float tile_max = running_max;
#pragma omp simd reduction(max : tile_max)
  for (int64_t i = 0; i < n; ++i) tile_max = std::max(tile_max, s[i]);
#if RADIXLM_VEC16_HALVES
  const float tile_sum = exp_tile8(s, n, tile_max);
#else
  float tile_sum = 0.f;
#pragma omp simd reduction(+ : tile_sum)
  for (int64_t i = 0; i < n; ++i) {
    s[i] = exp_nonpositive(s[i] - tile_max);
    tile_sum += s[i];
  }
#endif
  const float correction = exp_nonpositive(running_max - tile_max);
  running_sum = running_sum * correction + tile_sum;
  running_max = tile_max;
#pragma omp simd
  for (int64_t e = 0; e < d; ++e) acc[e] *= correction;
}

#if RADIXLM_BUILD_AVX512
// softmax_tile for the query heads [0, count) (count <= 16) of one tile of n <= kTile positions (soft-capped
// already) and d a multiple of 16: the per-head scalar steps (the new max, the correction, the sums) run as one
// vector across the heads, so that their latencies overlap (about 30% off the phase). Lanes past n weigh 0.
inline void softmax_heads(float* __restrict s, int64_t n, int64_t count, float* __restrict running_max,
                          float* __restrict running_sum, float* __restrict acc, int64_t d) {
  static_assert(kTile % 16 == 0, "a tile is whole vectors");
  constexpr int64_t kVectors = kTile / 16;
  const int64_t num_vectors = (n + 15) / 16;
  const __mmask16 last = static_cast<__mmask16>(0xFFFFu >> (16 * num_vectors - n));  // valid lanes of the last
  const __m512 floor = _mm512_set1_ps(-1e30f);
  alignas(64) float tile_max[16] = {}, sums[16] = {}, correction[16] = {};  // lanes past `count` are never used
  for (int64_t j = 0; j < count; ++j) {
    __m512 top = floor;
    for (int64_t v = 0; v < kVectors && v < num_vectors; ++v) {
      const __mmask16 valid = v + 1 == num_vectors ? last : 0xFFFF;
      top = _mm512_mask_max_ps(top, valid, top, _mm512_loadu_ps(s + j * kTile + 16 * v));
    }
    tile_max[j] = _mm512_reduce_max_ps(top);
  }
  const __mmask16 heads = static_cast<__mmask16>((1u << count) - 1);
  const __m512 old_max = _mm512_maskz_loadu_ps(heads, running_max);
  const __m512 new_max = _mm512_max_ps(old_max, _mm512_maskz_load_ps(heads, tile_max));
  _mm512_store_ps(correction, exp16_nonpositive(_mm512_sub_ps(old_max, new_max)));
  _mm512_mask_storeu_ps(running_max, heads, new_max);
  _mm512_store_ps(tile_max, new_max);
  for (int64_t j = 0; j < count; ++j) {
    const __m512 max = _mm512_set1_ps(tile_max[j]);
    __m512 total = _mm512_setzero_ps();
    for (int64_t v = 0; v < kVectors && v < num_vectors; ++v) {
      const __mmask16 valid = v + 1 == num_vectors ? last : 0xFFFF;
      const __m512 logits = _mm512_loadu_ps(s + j * kTile + 16 * v);
      const __m512 w = _mm512_maskz_mov_ps(valid, exp16_nonpositive(_mm512_sub_ps(logits, max)));
      _mm512_storeu_ps(s + j * kTile + 16 * v, w);
      total = _mm512_add_ps(total, w);
    }
    sums[j] = _mm512_reduce_add_ps(total);
    const __m512 scale = _mm512_set1_ps(correction[j]);
    for (int64_t e = 0; e < d; e += 16) {
      _mm512_storeu_ps(acc + j * d + e, _mm512_mul_ps(_mm512_loadu_ps(acc + j * d + e), scale));
    }
  }
  _mm512_mask_storeu_ps(running_sum, heads, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(heads, running_sum),
                                                            _mm512_load_ps(correction), _mm512_load_ps(sums)));
}
#endif

// The output of a row attended in parts (its splits, after a shared part if it has one): its partial records
// combined in order (each rescaled to the largest max), one query head at a time.
void merge_splits(const Problem& p, int64_t b) {
  const int64_t d = p.head_dim, count = num_records(p, b), stride = p.num_heads * (d + 2);
  for (int64_t h = 0; h < p.num_heads; ++h) {
    const float* first = p.partials + (p.partial_offsets[b] + h) * (d + 2);
    float top = -1e30f;
    for (int64_t k = 0; k < count; ++k) top = std::max(top, first[k * stride]);
    float out[radixlm_kv::kMaxHeadDim];  // the paged op checks head_dim against it
    std::fill(out, out + d, 0.f);
    float total = 0.f;
    for (int64_t k = 0; k < count; ++k) {
      const float* record = first + k * stride;
      const float weight = exp_nonpositive(record[0] - top);
      total += record[1] * weight;
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) out[e] += record[2 + e] * weight;
    }
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    store_output(p, (b * p.num_heads + h) * d, out, inverse, d);
  }
}

}  // namespace radixlm_attention
