// The GGUF linear's AVX-512 VNNI kernels (gguf_kernels.h): a tile's 16 output rows are the 16 int32 lanes of a
// register, and one vpdpbusd multiplies 4 weights of each row by 4 activation bytes broadcast to every lane, so a
// K-block of 32 weights costs 8 of them per activation row, and its scaling three more (convert, scale, offset;
// Q8_0 two, its offset taken back in int32 by starting the sum from it; Q6_K four for its two halves, their offsets
// taken back likewise and the step applied once: 1.15x Q6_K's former order at 256-1,024 rows). The unpacking of the
// quants (masks and shifts) is paid once per K-block for up to 8 rows.
//
// The arithmetic is gguf_portable.cpp's, operation for operation: the results are bit-identical to it. Every function
// here carries its target attribute (RADIXLM_AVX512, isa.h), so the file builds whatever the build's -march, and runs
// only after isa::cpu_has_avx512().

#include "gguf_kernels.h"
#include "gguf_vec512.h"
#include "isa.h"

// GCC 12 reports the undefined pass-through operands inside its own AVX-512 intrinsics (the conversions, the
// reductions) as uninitialized once they are inlined here: false positives of the header, not of this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace radixlm_gguf {
namespace {

// acc + the 4-byte dot products of w's lanes with the 4 bytes at p, broadcast to every lane: vpdpbusd with the
// broadcast folded into its memory operand. (GCC emits a separate vpbroadcastd, which takes a vector port: with it a
// K-block cost about a third more at 8 rows and more.)
RADIXLM_AVX512 inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// 4-bit quants of one K-block: vector p's low nibbles are group p, its high ones group p + 4.
RADIXLM_AVX512 inline void nibbles(const uint8_t* quants, __m512i* w) {
  const __m512i low4 = _mm512_set1_epi8(15);
  for (int p = 0; p < 4; ++p) {
    const __m512i v = _mm512_loadu_si512(quants + 64 * p);
    w[p] = _mm512_and_si512(v, low4);
    w[p + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  }
}

// A format: `prepare` reads a super-block's metadata, `block` a K-block's scales (one a row, for each 16-weight half:
// the same for both but in Q6_K), offsets (one a row; the formats that apply theirs in float) and quants, 8 vectors
// of 16 rows x 4 bytes.
struct Scales {
  __m512 scale[2], offset;
};

struct Q8_0 {  // the stored q + 128's share of a dot product is taken back in int32 (offset32)
  static constexpr int64_t kSuperWeights = 32, kSuperBytes = 544;
  static constexpr bool kHalves = false, kIntOffset = true;
  struct Meta { __m512 d; };
  RADIXLM_AVX512 static Meta prepare(const uint8_t* super) { return {halves16(super)}; }
  RADIXLM_AVX512 static void block(const Meta& m, const uint8_t* super, int, Scales& s, __m512i* w) {
    s.scale[0] = m.d;
    for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(super + 32 + 64 * g);
  }
};

template <bool kMin>
struct Q4Legacy {  // Q4_0: w = d (q - 8); Q4_1: w = d q + m
  static constexpr int64_t kSuperWeights = 32, kSuperBytes = kMin ? 320 : 288;
  static constexpr bool kHalves = false, kIntOffset = false;
  struct Meta { __m512 d, offset; };
  RADIXLM_AVX512 static Meta prepare(const uint8_t* super) {
    const __m512 d = halves16(super);
    return {d, kMin ? halves16(super + 32) : _mm512_mul_ps(_mm512_set1_ps(-8.f), d)};
  }
  RADIXLM_AVX512 static void block(const Meta& m, const uint8_t* super, int, Scales& s, __m512i* w) {
    s.scale[0] = m.d;
    s.offset = m.offset;
    nibbles(super + (kMin ? 64 : 32), w);
  }
};

struct Q4_K {  // w = (d scale_j) q - (dmin min_j)
  static constexpr int64_t kSuperWeights = 256, kSuperBytes = 2368;
  static constexpr bool kHalves = false, kIntOffset = false;
  struct Meta { __m512 d, dmin; };
  RADIXLM_AVX512 static Meta prepare(const uint8_t* super) { return {halves16(super), halves16(super + 32)}; }
  RADIXLM_AVX512 static void block(const Meta& m, const uint8_t* super, int j, Scales& s, __m512i* w) {
    s.scale[0] = _mm512_mul_ps(m.d, bytes16(super + 64 + 16 * j, false));
    s.offset = negate(_mm512_mul_ps(m.dmin, bytes16(super + 192 + 16 * j, false)));
    nibbles(super + 320 + 256 * j, w);
  }
};

struct Q6_K {  // w = (d scale) (q - 32), a scale per 16 weights (its offset in int32: offset16)
  static constexpr int64_t kSuperWeights = 256, kSuperBytes = 3360;
  static constexpr bool kHalves = true, kIntOffset = false;
  struct Meta { __m512 d; };
  RADIXLM_AVX512 static Meta prepare(const uint8_t* super) { return {halves16(super)}; }
  RADIXLM_AVX512 static void block(const Meta& m, const uint8_t* super, int j, Scales& s, __m512i* w) {
    for (int h = 0; h < 2; ++h) s.scale[h] = _mm512_mul_ps(m.d, bytes16(super + 32 + 16 * (2 * j + h), true));
    const uint8_t* quants = super + 288 + 384 * j;
    nibbles(quants, w);
    const __m512i bits45 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {  // bits 2c, 2c + 1 of vector h: group 4h + c's, moved to bits 4, 5
      const __m512i v = _mm512_loadu_si512(quants + 256 + 64 * h);
      const __m512i moved[4] = {_mm512_slli_epi16(v, 4), _mm512_slli_epi16(v, 2), v, _mm512_srli_epi16(v, 2)};
      for (int c = 0; c < 4; ++c) w[4 * h + c] = _mm512_or_si512(w[4 * h + c], _mm512_and_si512(moved[c], bits45));
    }
  }
};

template <class F, int kRows>
RADIXLM_AVX512 void tile_rows(const uint8_t* tile, const Activations& x, int64_t m0, float* out, int64_t ld_out,
                              int64_t cols, const float* bias, bool accumulate) {
  constexpr int64_t kPerSuper = F::kSuperWeights / kBlock;
  const int64_t blocks = x.k / kBlock;
  __m512 acc[kRows];
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  for (int r = 0; r < kRows; ++r) {
    acc[r] = accumulate ? _mm512_maskz_loadu_ps(mask, out + (m0 + r) * ld_out) : _mm512_setzero_ps();
  }
  for (int64_t b0 = 0; b0 < blocks; b0 += kPerSuper, tile += F::kSuperBytes) {
    const typename F::Meta meta = F::prepare(tile);
#pragma GCC unroll 1
    for (int j = 0; j < kPerSuper; ++j) {
      const int64_t b = b0 + j;
      Scales s;
      __m512i w[8];
      // The K-blocks kPrefetchBytes and kPrefetchL2Bytes ahead are requested now: the hardware prefetcher alone left
      // one row's decode at about half the memory bandwidth.
      const uint8_t* ahead = tile + F::kSuperBytes * j / kPerSuper;
      for (int64_t line = 0; line < F::kSuperBytes / kPerSuper; line += 64) {
        _mm_prefetch(ahead + kPrefetchBytes + line, _MM_HINT_T0);
        _mm_prefetch(ahead + kPrefetchL2Bytes + line, _MM_HINT_T1);
      }
      F::block(meta, tile, j, s, w);
#pragma GCC unroll 8  // the rows' accumulators stay in registers only when the loop is unrolled
      for (int r = 0; r < kRows; ++r) {
        const int64_t m = m0 + r;
        const int8_t* xq = x.q + (m * x.row_blocks + b) * kBlock;
        const __m512 step = _mm512_set1_ps(x.step[m * x.row_blocks + b]);
        if constexpr (F::kHalves) {  // two sums, each started from its offset, each with its own scale
          const int32_t* offset16 = x.offset16 + 2 * (m * x.row_blocks + b);
          __m512i low = _mm512_set1_epi32(offset16[0]), high = _mm512_set1_epi32(offset16[1]);
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g) low = dpbusd_broadcast(low, w[g], xq + 4 * g);
#pragma GCC unroll 4
          for (int g = 4; g < 8; ++g) high = dpbusd_broadcast(high, w[g], xq + 4 * g);
          const __m512 halves = _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), s.scale[1],
                                                _mm512_mul_ps(_mm512_cvtepi32_ps(low), s.scale[0]));
          acc[r] = _mm512_fmadd_ps(halves, step, acc[r]);
        } else {  // one sum a row (the chunk's rows keep enough of them in flight), Q8_0's started from its offset
          __m512i dot = F::kIntOffset ? _mm512_set1_epi32(x.offset32[m * x.row_blocks + b]) : _mm512_setzero_si512();
#pragma GCC unroll 8
          for (int g = 0; g < 8; ++g) dot = dpbusd_broadcast(dot, w[g], xq + 4 * g);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s.scale[0], step), acc[r]);
          if constexpr (!F::kIntOffset) {
            acc[r] = _mm512_fmadd_ps(s.offset, _mm512_set1_ps(x.sum32[m * x.row_blocks + b]), acc[r]);
          }
        }
      }
    }
  }
  const __m512 bias_v = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int r = 0; r < kRows; ++r) {
    const __m512 v = bias ? _mm512_add_ps(acc[r], bias_v) : acc[r];
    _mm512_mask_storeu_ps(out + (m0 + r) * ld_out, mask, v);
  }
}

template <class F>
RADIXLM_AVX512 void tile_kernel(const uint8_t* tile, const Activations& x, int64_t m0, int64_t rows, float* out,
                                int64_t ld_out, int64_t cols, const float* bias, bool accumulate) {
  switch (rows) {
    case 1: return tile_rows<F, 1>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 2: return tile_rows<F, 2>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 3: return tile_rows<F, 3>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 4: return tile_rows<F, 4>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 5: return tile_rows<F, 5>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 6: return tile_rows<F, 6>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 7: return tile_rows<F, 7>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    default: return tile_rows<F, 8>(tile, x, m0, out, ld_out, cols, bias, accumulate);
  }
}

}  // namespace

TileKernel avx512_kernel(int64_t type) {
  switch (type) {
    case kQ8_0: return tile_kernel<Q8_0>;
    case kQ4_0: return tile_kernel<Q4Legacy<false>>;
    case kQ4_1: return tile_kernel<Q4Legacy<true>>;
    case kQ4_K: return tile_kernel<Q4_K>;
    case kQ6_K: return tile_kernel<Q6_K>;
    default: return nullptr;
  }
}

}  // namespace radixlm_gguf
