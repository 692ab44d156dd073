// A 16 x 16 transpose of 32-bit words in AVX-512 registers, shared by the kernels that need one (the float32 linear's
// lane sums, the AMX linear's x and output blocks, the packing of keys into the pair layouts). Built whatever the -march (its own target), called only where
// the CPU has AVX-512.
#pragma once

#include <immintrin.h>

namespace radixlm {

// r[j] = word j of the 16 input rows r[0..15]: pairs of rows interleaved by words, then by word pairs, which leaves
// each 128-bit lane L of r[4q + e] holding word 4L + e of rows 4q .. 4q + 3; those lanes are then transposed 4 x 4.
__attribute__((target("avx512f"))) inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: [a0 b0 a1 b1], [a2 b2 a3 b3]
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {
    r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i s0 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44), s1 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44);
    const __m512i s3 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
    t[e] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    t[4 + e] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    t[8 + e] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    t[12 + e] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// The same for float32 lanes (the casts move nothing).
__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
  __m512i words[16];
  for (int i = 0; i < 16; ++i) words[i] = _mm512_castps_si512(r[i]);
  transpose16(words);
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castsi512_ps(words[i]);
}

}  // namespace radixlm
