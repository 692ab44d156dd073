// 16-lane float vectors for the bfloat16 kernels (csrc/norm, csrc/activation, the attention tiles): bfloat16 widened
// to float32 by a shift (exact), float32 rounded back to bfloat16 to nearest-even (NaN kept a quiet NaN), as PyTorch
// rounds it.
// GCC lowers a 16-lane vector to one AVX-512 register or two AVX2 ones, whichever -march allows.
#pragma once

#include <cstdint>
#include <cstring>

#include "isa.h"

namespace radixlm_bf16 {

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

inline v16f load16(const uint16_t* p) {
#if RADIXLM_BUILD_AVX512  // one zero-extending load and a shift (GCC 12 lowers the portable form to five)
  const __m256i narrow = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return reinterpret_cast<v16f>(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(narrow), 16)));
#else
  v16h narrow;
  std::memcpy(&narrow, p, sizeof(narrow));
  const v16u wide = __builtin_convertvector(narrow, v16u) << 16;
  v16f v;
  std::memcpy(&v, &wide, sizeof(v));
  return v;
#endif
}

inline void store16(uint16_t* p, v16f v) {
  v16u bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const v16u rounded = (bits + (0x7FFFu + ((bits >> 16) & 1u))) >> 16;
  const v16u quiet_nan = (bits >> 16) | 0x0040u;
  const v16u chosen = v == v ? rounded : quiet_nan;  // a NaN's rounding could carry into the exponent
  const v16h narrow = __builtin_convertvector(chosen, v16h);
  std::memcpy(p, &narrow, sizeof(narrow));
}

inline float to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (f != f) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float hsum(v16f v) {
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

}  // namespace radixlm_bf16
