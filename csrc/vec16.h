// 16 float32 lanes for the kernels whose instruction set is the build's (csrc/isa.h): the decode attention's tiles
// (csrc/attention/attention_tiles.h) and the float32 small-batch linear (csrc/linear/linear.cpp). The AVX-512 build
// uses a GCC vector type (one register). The AVX2 build spells the two AVX2 registers out: GCC 12 lowers a 64-byte
// vector type there through the stack in loops that keep several of them live (the attention tiles ran at 11-13
// GFLOP/s, the float32 linear at 4-9 rows at a quarter of the AVX-512 build's speed).
#pragma once

#include <cstring>

#include "isa.h"

namespace radixlm_vec {

#if !RADIXLM_BUILD_AVX512 && defined(__AVX2__)
#define RADIXLM_VEC16_HALVES 1

struct v16f {
  __m256 lo, hi;
};

inline v16f operator*(v16f a, v16f b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline v16f operator*(__m256 a, v16f b) { return {_mm256_mul_ps(a, b.lo), _mm256_mul_ps(a, b.hi)}; }
inline v16f operator*(float a, v16f b) { return _mm256_set1_ps(a) * b; }
inline v16f& operator+=(v16f& a, v16f b) {
  a = {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
  return a;
}

inline v16f load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }

inline void store16(float* p, v16f v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
#else
#define RADIXLM_VEC16_HALVES 0

typedef float v16f __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }
#endif

// The sum of the 16 lanes in lane order (0 first), in either build.
inline float hsum(v16f v) {
  alignas(64) float lanes[16];
  store16(lanes, v);
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += lanes[i];
  return s;
}

}  // namespace radixlm_vec
