// The GGUF linear's activation quantization in AVX2 and AVX-512 (gguf_kernels.h: quantize_block_avx2 and
// quantize_block_avx512): the scalar quantize_block's operations (gguf_activations.cpp) on 8 and 16 lanes, with the
// same results. The maximum and the integer sums are exact in any order, and the conversions round half to even like
// nearbyint (MXCSR's default mode). Each function carries its target attribute (isa.h), so the file builds whatever
// the build's -march, and runs only after the matching isa::cpu_has_* check.

#include "gguf_kernels.h"
#include "isa.h"

// GCC 12 reports the undefined pass-through operands inside its own AVX-512 intrinsics (the conversions, the
// reductions) as uninitialized once they are inlined here: false positives of the header, not of this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cmath>
#include <limits>

namespace radixlm_gguf {
namespace {

RADIXLM_AVX2 inline int32_t sum8(__m256i v) {  // exact in any order
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
  return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 1)));
}

RADIXLM_AVX2 void quantize_block_avx2_impl(const float* x, int8_t* q, float* step, int32_t* offset32, float* sum32,
                                           int32_t* offset16) {
  __m256 v[4], top8 = _mm256_setzero_ps();
  int below_inf = 0xff;
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.f), v[i]);
    // An ordered compare: false for NaN as for inf.
    below_inf &= _mm256_movemask_ps(
        _mm256_cmp_ps(magnitude, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ));
    top8 = _mm256_max_ps(top8, magnitude);
  }
  const bool finite = below_inf == 0xff;
  __m128 top4 = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
  top4 = _mm_max_ps(top4, _mm_movehl_ps(top4, top4));
  const float top = finite ? _mm_cvtss_f32(_mm_max_ss(top4, _mm_shuffle_ps(top4, top4, 1))) : 0.f;
  const float inverse = 127.f / top;
  const bool usable = finite && top > 0.f && std::isfinite(inverse);
  __m256i n[4];
  for (int i = 0; i < 4; ++i) {
    n[i] = usable ? _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inverse))) : _mm256_setzero_si256();
  }
  // Packing interleaves the 128-bit lanes: 4-byte groups come out as n0[0:4] n1[0:4] n2[0:4] n3[0:4] n0[4:8] ...
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const int32_t halves[2] = {sum8(_mm256_add_epi32(n[0], n[1])), sum8(_mm256_add_epi32(n[2], n[3]))};
  *step = !finite ? std::numeric_limits<float>::quiet_NaN() : usable ? top / 127.f : 0.f;
  const int32_t sum = halves[0] + halves[1];
  *offset32 = -128 * sum;
  *sum32 = *step * static_cast<float>(sum);
  offset16[0] = -32 * halves[0];
  offset16[1] = -32 * halves[1];
}

RADIXLM_AVX512 void quantize_block_avx512_impl(const float* x, int8_t* q, float* step, int32_t* offset32, float* sum32,
                                               int32_t* offset16) {
  const __m512 half[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
  const __m512 magnitude[2] = {_mm512_abs_ps(half[0]), _mm512_abs_ps(half[1])};
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  // Not below infinity: inf or NaN (an unordered compare is true).
  const bool finite = !(_mm512_cmp_ps_mask(magnitude[0], inf, _CMP_NLT_UQ) |
                        _mm512_cmp_ps_mask(magnitude[1], inf, _CMP_NLT_UQ));
  const float top = finite ? _mm512_reduce_max_ps(_mm512_max_ps(magnitude[0], magnitude[1])) : 0.f;
  const float inverse = 127.f / top;
  const bool usable = finite && top > 0.f && std::isfinite(inverse);
  int32_t halves[2] = {0, 0};
  for (int h = 0; h < 2; ++h) {
    const __m512i v = usable ? _mm512_cvtps_epi32(_mm512_mul_ps(half[h], _mm512_set1_ps(inverse)))
                             : _mm512_setzero_si512();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtsepi32_epi8(v));
    halves[h] = _mm512_reduce_add_epi32(v);
  }
  *step = !finite ? std::numeric_limits<float>::quiet_NaN() : usable ? top / 127.f : 0.f;
  const int32_t sum = halves[0] + halves[1];
  *offset32 = -128 * sum;
  *sum32 = *step * static_cast<float>(sum);
  offset16[0] = -32 * halves[0];
  offset16[1] = -32 * halves[1];
}

}  // namespace

void quantize_block_avx2(const float* x, int8_t* q, float* step, int32_t* offset32, float* sum32, int32_t* offset16) {
  quantize_block_avx2_impl(x, q, step, offset32, sum32, offset16);
}

void quantize_block_avx512(const float* x, int8_t* q, float* step, int32_t* offset32, float* sum32, int32_t* offset16) {
  quantize_block_avx512_impl(x, q, step, offset32, sum32, offset16);
}

}  // namespace radixlm_gguf
