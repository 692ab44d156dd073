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
#elif defined(__AVX2__)  // the same on two halves: GCC 12's portable form went through the stack, 8-10x slower
  const __m256i wide[2] = {
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16),
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))), 16)};
  v16f v;
  std::memcpy(&v, wide, sizeof(v));
  return v;
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
#if !RADIXLM_BUILD_AVX512 && defined(__AVX2__)  // the portable form's steps on two halves (see load16)
  __m256 halves[2];
  std::memcpy(halves, &v, sizeof(halves));
  __m256i chosen[2];
  for (int h = 0; h < 2; ++h) {
    const __m256i bits = _mm256_castps_si256(halves[h]);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
    const __m256 is_nan = _mm256_cmp_ps(halves[h], halves[h], _CMP_UNORD_Q);
    chosen[h] = _mm256_blendv_epi8(rounded, quiet_nan, _mm256_castps_si256(is_nan));
  }
  // packus interleaves the 128-bit lanes (h0 0-3, h1 0-3, h0 4-7, h1 4-7); the permute puts them back in order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(chosen[0], chosen[1]), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
#else
  v16u bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const v16u rounded = (bits + (0x7FFFu + ((bits >> 16) & 1u))) >> 16;
  const v16u quiet_nan = (bits >> 16) | 0x0040u;
  const v16u chosen = v == v ? rounded : quiet_nan;  // a NaN's rounding could carry into the exponent
  const v16h narrow = __builtin_convertvector(chosen, v16h);
  std::memcpy(p, &narrow, sizeof(narrow));
#endif
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
