// Register-tiled score and value phases of the paged decode kernel (csrc/paged_attention.cpp), for head_dim = 16 * kC.
// Included by that file only; the namespace keeps these names to it.
//
// A group of up to kG query heads that share a KV head keeps its query rows (scores) or output accumulators
// (values) in vector registers across the tile's positions, so each K/V row is loaded once per group from L1 and
// every accumulator update is an FMA on a register, not a load-FMA-store through memory.

#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace radixlm_attention {

constexpr int64_t kTile = 32;  // positions scored before each softmax rescale

typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline v16f load16(const at::BFloat16* p) {
  v16u16 narrow;
  std::memcpy(&narrow, p, sizeof(narrow));
  const v16u32 wide = __builtin_convertvector(narrow, v16u32) << 16;
  v16f v;
  std::memcpy(&v, &wide, sizeof(v));
  return v;
}

inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }

inline float reduce16(v16f v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
#else
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
#endif
}

// Asks for one K/V row (one head of one position) ahead of its use, into L2.
template <typename scalar_t, int64_t kD>
inline void prefetch_row(const scalar_t* row) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t line = 0; line < kD * static_cast<int64_t>(sizeof(scalar_t)); line += 64) {
    __builtin_prefetch(bytes + line, 0, 2);
  }
}

// scores[(j0 + g) * kTile + i] = scale * q_{j0+g} . k_i for the tile's n positions of KV head h.
template <typename scalar_t, int64_t kC, int64_t kG>
inline void score_group(const float* q, const scalar_t* keys, const int64_t* rows, int64_t n, int64_t h, int64_t j0,
                        float scale, float* scores, const int64_t* next, int64_t num_next) {
  constexpr int64_t d = 16 * kC;
  v16f qv[kG][kC];
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t c = 0; c < kC; ++c) qv[g][c] = load16(q + (j0 + g) * d + 16 * c);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i < num_next) prefetch_row<scalar_t, d>(keys + next[i] + h * d);
    const scalar_t* k = keys + rows[i] + h * d;
    v16f kv[kC];
    for (int64_t c = 0; c < kC; ++c) kv[c] = load16(k + 16 * c);
    for (int64_t g = 0; g < kG; ++g) {
      v16f part = qv[g][0] * kv[0];
      for (int64_t c = 1; c < kC; ++c) part += qv[g][c] * kv[c];
      scores[(j0 + g) * kTile + i] = reduce16(part) * scale;
    }
  }
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

// Query heads per register group: kG * kC accumulators plus a row must fit in 32 vector registers.
template <int64_t kC>
constexpr int64_t kGroup = kC <= 4 ? 4 : 2;

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
