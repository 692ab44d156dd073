// exp(x) for x <= 0, shared by the decode kernel's softmax (csrc/attention) and the gated MLP's activation
// (csrc/activation): a scalar form the compiler vectorises, and the same steps on 16 lanes (AVX-512) or 8 (AVX2).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "isa.h"

namespace radixlm {

// exp(x) for x <= 0 (a logit minus the running max; -|x| in silu), written so the compiler vectorises it (std::exp
// does not vectorise without -ffast-math): Cody-Waite range reduction and a degree-6 polynomial, ~2 ulp. Inputs below
// -87 give ~1e-38 instead of 0, which no sum of probabilities can notice.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  // Round x / ln2 to the nearest integer n by the 1.5 * 2^23 trick (floor and lrint do not vectorise everywhere).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t exponent = static_cast<int32_t>(n) + 127;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(exponent) << 23);
  return y * scale;
}

// exp_nonpositive on 16 lanes at once, the same steps (the compiler does not turn the scalar loop's reductions and
// range reduction into code this tight). Built whatever the -march (its own target), for the kernels built for the
// machine's AVX-512 and for those chosen at run time (csrc/isa.h); called only where the CPU has AVX-512.
__attribute__((target("avx512f"))) inline __m512 exp16_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);  // this order keeps a NaN (maxps returns its second operand then)
  const __m512 round = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), round), round);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
  }
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(exponent));
}

// exp16_nonpositive's steps on 8 lanes, for the AVX2 build's bfloat16 kernels (silu_and_mul).
__attribute__((target("avx2,fma"))) inline __m256 exp8_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  // this order keeps a NaN, as above
  const __m256 round = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), round), round);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
  }
  y = _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
}

}  // namespace radixlm
