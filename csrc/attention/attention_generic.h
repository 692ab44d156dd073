// The score and value phases of the paged decode kernel (paged_attention.cpp) for any head_dim: plain loops that
// the compiler vectorises, used for every head_dim but 64 and 128 (those are compiled in, and get attention_tiles.h's
// faster register-tiled phases). Included by that file only; the namespace keeps these names to it.

#pragma once

#include <ATen/ATen.h>

#include <bit>
#include <cstdint>

#include "attention_tiles.h"

namespace radixlm_attention {

// Element e of a K/V row as float32. bfloat16 is the top half of a float32, so widening is a zero-extend and a
// shift, which the compiler fuses into the vectorised loops below (no widened copy of the row is written).
inline float load(const float* row, int64_t e) { return row[e]; }

inline float load(const at::BFloat16* row, int64_t e) {
  const uint32_t wide = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[e]) << 16;
  return std::bit_cast<float>(wide);
}

inline float load(const int8_t* row, int64_t e) { return static_cast<float>(row[e]); }

template <typename scalar_t>
inline float dot(const float* __restrict q, const scalar_t* __restrict k, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t e = 0; e < n; ++e) sum += q[e] * load(k, e);
  return sum;
}

template <typename scalar_t>
inline void add_scaled(float* __restrict acc, float weight, const scalar_t* __restrict v, int64_t n) {
#pragma omp simd
  for (int64_t e = 0; e < n; ++e) acc[e] += weight * load(v, e);
}

// scores[j, i] = scale * q_j . k_i for the `n` positions of a tile (element offsets `rows[i]` of KV head h0) and
// the item's query heads j, KV head h0 + j / rep. Rows outer, heads inner: a K row serves its `rep` heads from L1.
template <typename scalar_t>
inline void score_tile(const float* q, const scalar_t* keys, const int64_t* rows, int64_t n, int64_t num_kv,
                       int64_t rep, int64_t d, float scale, float* scores) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < num_kv; ++h) {
      const scalar_t* k = keys + rows[i] + h * d;
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t j = h * rep + r;
        scores[j * kTile + i] = dot(q + j * d, k, d) * scale;
      }
    }
  }
}

// acc[j] += sum_i scores[j, i] * v_i over the `n` positions of a tile for the item's query heads j, KV head j / rep,
// positions in order.
template <typename scalar_t>
inline void value_tile(float* acc, const scalar_t* values, const int64_t* rows, int64_t n, int64_t num_kv, int64_t rep,
                       int64_t d, const float* scores) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < num_kv; ++h) {
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t j = h * rep + r;
        add_scaled(acc + j * d, scores[j * kTile + i], values + rows[i] + h * d, d);
      }
    }
  }
}

}  // namespace radixlm_attention
