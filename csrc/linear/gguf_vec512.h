// Vectors of a GGUF tile's metadata (its 16 rows side by side, one a lane) as float32, for the AVX-512 kernels
// (gguf_avx512.cpp) and the AMX path's operands (gguf_amx_operands.h). Each carries its target (RADIXLM_AVX512, which
// the AMX functions' target includes), so the callers build whatever the build's -march.
#pragma once

#include <cstdint>

#include "../isa.h"

namespace radixlm_gguf {

RADIXLM_AVX512 inline __m512 halves16(const uint8_t* p) {  // 16 float16 values, one a row
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

RADIXLM_AVX512 inline __m512 bytes16(const uint8_t* p, bool is_signed) {  // 16 bytes, one a row, as floats
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
}

RADIXLM_AVX512 inline __m512 negate(__m512 v) {  // -v exactly as C++'s unary minus (the sign bit flipped)
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)));
}

}  // namespace radixlm_gguf
