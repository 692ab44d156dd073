// The GGUF linear's AVX2 kernels (gguf_kernels.h), for CPUs without AVX-512 VNNI (Zen 3 and older): the tile's 16
// output rows are two registers of 8 int32 lanes, each lane's 4 weights multiplied by 4 activation bytes with
// vpmaddubsw (pairs of unsigned x signed bytes into int16) and vpmaddwd (pairs of int16 into int32), the int16 pairs
// of several groups added first where their sum cannot overflow (all 8 groups of a 4-bit K-block, 2 of Q6_K's). The
// int16 pairs stay below 2^15 for 4- and 6-bit quants (15 x 127 x 2, 63 x 127 x 2); Q8_0's 8-bit ones would not, so
// Q8_0 takes |q| times the activation with q's sign (vpsignb): the true dot product, which the other paths reach by
// taking the stored q + 128's share (offset32) back in int32.
//
// The arithmetic is gguf_portable.cpp's, operation for operation: the results are bit-identical to it. Every function
// here carries its target attribute (RADIXLM_AVX2, isa.h), so the file builds whatever the build's -march, and runs
// only after isa::cpu_has_avx2().

#include "gguf_kernels.h"
#include "isa.h"

namespace radixlm_gguf {
namespace {

// Up to this many rows, one pass over the tile serves both halves (tile_rows); more rows take a pass a half.
constexpr int kPairedRows = 2;

RADIXLM_AVX2 inline __m256 halves8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

RADIXLM_AVX2 inline __m256 bytes8(const uint8_t* p, bool is_signed) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

RADIXLM_AVX2 inline __m256 negate(__m256 v) {
  return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(v), _mm256_set1_epi32(INT32_MIN)));
}

// Half `half` (rows 8 half .. 8 half + 7) of one K-block's 4-bit quants: group p from vector p's low nibbles, p + 4
// from its high ones.
RADIXLM_AVX2 inline void nibbles(const uint8_t* quants, int half, __m256i* w) {
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int p = 0; p < 4; ++p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * p + 32 * half));
    w[p] = _mm256_and_si256(v, low4);
    w[p + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  }
}

struct Scales {
  __m256 scale[2], offset;
};

// kWiden: groups whose int16 pairs may be added before widening. A pair of 4-bit quants (at most 15) times
// activations (|x| <= 127) is at most 3,810, so all 8 groups fit (nibble_rows); 6-bit (63) 16,002, two groups;
// Q8_0's |q| (up to 128) 32,512, one.
struct Q8_0 {
  static constexpr int64_t kSuperWeights = 32, kSuperBytes = 544;
  static constexpr bool kHalves = false, kSigned = true, kNibbles = false;
  static constexpr int kWiden = 1;
  RADIXLM_AVX2 static void block(const uint8_t* super, int, int half, Scales& s, __m256i* w) {
    const __m256 d = halves8(super + 16 * half);
    s.scale[0] = d;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // stored q + 128 -> q
    for (int g = 0; g < 8; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 32 + 64 * g + 32 * half));
      w[g] = _mm256_xor_si256(v, flip);
    }
  }
};

// The 4-bit formats (kNibbles) run nibble_rows: `scales` sets a K-block's scale and offset for one half of the tile
// and returns its quants (4 vectors of 64 bytes: vector p's low nibbles are group p, its high ones group p + 4).
template <bool kMin>
struct Q4Legacy {
  static constexpr int64_t kSuperWeights = 32, kSuperBytes = kMin ? 320 : 288;
  static constexpr bool kNibbles = true;
  RADIXLM_AVX2 static const uint8_t* scales(const uint8_t* super, int, int half, Scales& s) {
    const __m256 d = halves8(super + 16 * half);
    s.scale[0] = d;
    s.offset = kMin ? halves8(super + 32 + 16 * half) : _mm256_mul_ps(_mm256_set1_ps(-8.f), d);
    return super + (kMin ? 64 : 32);
  }
};

struct Q4_K {
  static constexpr int64_t kSuperWeights = 256, kSuperBytes = 2368;
  static constexpr bool kNibbles = true;
  RADIXLM_AVX2 static const uint8_t* scales(const uint8_t* super, int j, int half, Scales& s) {
    s.scale[0] = _mm256_mul_ps(halves8(super + 16 * half), bytes8(super + 64 + 16 * j + 8 * half, false));
    const __m256 dmin = halves8(super + 32 + 16 * half);
    s.offset = negate(_mm256_mul_ps(dmin, bytes8(super + 192 + 16 * j + 8 * half, false)));
    return super + 320 + 256 * j;
  }
};

struct Q6_K {
  static constexpr int64_t kSuperWeights = 256, kSuperBytes = 3360;
  static constexpr bool kHalves = true, kSigned = false, kNibbles = false;
  static constexpr int kWiden = 2;
  RADIXLM_AVX2 static void block(const uint8_t* super, int j, int half, Scales& s, __m256i* w) {
    const __m256 d = halves8(super + 16 * half);
    for (int h = 0; h < 2; ++h) s.scale[h] = _mm256_mul_ps(d, bytes8(super + 32 + 16 * (2 * j + h) + 8 * half, true));
    const uint8_t* quants = super + 288 + 384 * j;
    nibbles(quants, half, w);
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 256 + 64 * h + 32 * half));
      const __m256i moved[4] = {_mm256_slli_epi16(v, 4), _mm256_slli_epi16(v, 2), v, _mm256_srli_epi16(v, 2)};
      for (int c = 0; c < 4; ++c) w[4 * h + c] = _mm256_or_si256(w[4 * h + c], _mm256_and_si256(moved[c], bits45));
    }
  }
};

// The int32 lane sums of kGroups groups: weights w[g] (unsigned, or signed for Q8_0) times the activations' 4 bytes
// at xq + 4 g. vpmaddubsw's int16 pairs of kWiden groups are added in int16 before vpmaddwd widens them: exact while
// their sum stays below 2^15 (see each format's kWiden), so the int32 sums are those of any other order.
template <int kGroups, int kWiden, bool kSigned>
RADIXLM_AVX2 inline __m256i dot_groups(const __m256i* w, const int8_t* xq) {
  const __m256i ones = _mm256_set1_epi16(1);
  const auto pairs = [&](int g) {
    const __m256i xv = _mm256_set1_epi32(load_i32(xq + 4 * g));
    return kSigned ? _mm256_maddubs_epi16(_mm256_sign_epi8(w[g], w[g]), _mm256_sign_epi8(xv, w[g]))
                   : _mm256_maddubs_epi16(w[g], xv);
  };
  __m256i sum = _mm256_setzero_si256();
  for (int g0 = 0; g0 < kGroups; g0 += kWiden) {
    __m256i pair_sum = pairs(g0);
    for (int g = g0 + 1; g < g0 + kWiden; ++g) pair_sum = _mm256_add_epi16(pair_sum, pairs(g));
    const __m256i widened = _mm256_madd_epi16(pair_sum, ones);
    sum = g0 == 0 ? widened : _mm256_add_epi32(sum, widened);
  }
  return sum;
}

// Lanes c < valid of 8 (0 < valid < 8), for maskload/maskstore: a masked-off lane is neither read nor written, so a
// tile's last columns never touch memory past the output's row or the bias.
RADIXLM_AVX2 inline __m256i lane_mask(int64_t valid) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 floats at p, of which `valid` (may be <= 0 or above 8) are real: zeros past them. One vector move (a vector
// rebuilt from scalar stores stalls its load on store forwarding), masked only where a tile's last columns need it.
RADIXLM_AVX2 inline __m256 load_lanes(const float* p, int64_t valid) {
  if (valid >= 8) return _mm256_loadu_ps(p);
  return valid <= 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(p, lane_mask(valid));
}

RADIXLM_AVX2 inline void store_lanes(float* p, int64_t valid, __m256 v) {
  if (valid >= 8) {
    _mm256_storeu_ps(p, v);
  } else if (valid > 0) {
    _mm256_maskstore_ps(p, lane_mask(valid), v);
  }
}

// A chunk's running sums for kSpan halves of the tile from `half` (8 output columns each, of `cols` real ones):
// loaded from out when `accumulate`, else zero.
template <int kRows, int kSpan>
RADIXLM_AVX2 inline void start_sums(__m256 (*acc)[kRows], const float* out, int64_t ld_out, int half, int64_t cols,
                                    bool accumulate) {
  for (int h = 0; h < kSpan; ++h) {
    for (int r = 0; r < kRows; ++r) {
      acc[h][r] = accumulate ? load_lanes(out + r * ld_out + 8 * (half + h), cols - 8 * (half + h))
                             : _mm256_setzero_ps();
    }
  }
}

// The sums stored back, the bias (if any) added first.
template <int kRows, int kSpan>
RADIXLM_AVX2 inline void finish_sums(__m256 (*acc)[kRows], float* out, int64_t ld_out, int half, int64_t cols,
                                     const float* bias) {
  for (int h = 0; h < kSpan; ++h) {
    const int64_t valid = cols - 8 * (half + h);
    const __m256 b = bias ? load_lanes(bias + 8 * (half + h), valid) : _mm256_setzero_ps();
    for (int r = 0; r < kRows; ++r) {
      // no bias adds nothing: v + 0 would turn a -0 sum into +0
      store_lanes(out + r * ld_out + 8 * (half + h), valid, bias ? _mm256_add_ps(acc[h][r], b) : acc[h][r]);
    }
  }
}

// K-block j of a super-block's share of the tile, requested kPrefetchBytes and kPrefetchL2Bytes ahead. Only a pass
// that starts at the first half asks: it reads the tile from memory; a second pass finds it in L1.
template <class F>
RADIXLM_AVX2 inline void prefetch_block(const uint8_t* super, int j) {
  constexpr int64_t kPerSuper = F::kSuperWeights / kBlock;
  const uint8_t* ahead = super + F::kSuperBytes * j / kPerSuper;
  for (int64_t line = 0; line < F::kSuperBytes / kPerSuper; line += 64) {
    _mm_prefetch(ahead + kPrefetchBytes + line, _MM_HINT_T0);
    _mm_prefetch(ahead + kPrefetchL2Bytes + line, _MM_HINT_T1);
  }
}

// Q8_0 and Q6_K: a K-block's 8 weight vectors unpacked first, then each row's dot products (dot_groups), up to
// kChunkRows rows a pass. The 8 vectors and a row's temporaries fill the registers, so the rows' sums live in memory
// (a load and a store a row and K-block); unpacking for 8 rows rather than 4 made Q6_K at 5-256 rows 1.11-1.22x
// faster on a Zen 3 (Q8_0 unchanged), same bits. kSpan halves (from `half`) a pass: see tile_rows.
template <class F, int kRows, int kSpan>
RADIXLM_AVX2 void half_rows(const uint8_t* tile, const Activations& x, int64_t m0, int half, float* out,
                            int64_t ld_out, int64_t cols, const float* bias, bool accumulate) {
  constexpr int64_t kPerSuper = F::kSuperWeights / kBlock;
  const int64_t blocks = x.k / kBlock;
  __m256 acc[kSpan][kRows];
  start_sums<kRows, kSpan>(acc, out + m0 * ld_out, ld_out, half, cols, accumulate);
  for (int64_t b0 = 0; b0 < blocks; b0 += kPerSuper, tile += F::kSuperBytes) {
    for (int j = 0; j < kPerSuper; ++j) {
      const int64_t b = b0 + j;
      if (half == 0) prefetch_block<F>(tile, j);
      for (int h = 0; h < kSpan; ++h) {
        Scales s;
        __m256i w[8];
        F::block(tile, j, half + h, s, w);
        for (int r = 0; r < kRows; ++r) {
          const int64_t mb = (m0 + r) * x.row_blocks + b;
          const int8_t* xq = x.q + mb * kBlock;
          const __m256 step = _mm256_set1_ps(x.step[mb]);
          if constexpr (F::kHalves) {
            // Q6_K's offsets (q - 32) taken back in int32, the step applied once for both halves (gguf_portable.cpp)
            const __m256i low = _mm256_add_epi32(dot_groups<4, F::kWiden, F::kSigned>(w, xq),
                                                 _mm256_set1_epi32(x.offset16[2 * mb]));
            const __m256i high = _mm256_add_epi32(dot_groups<4, F::kWiden, F::kSigned>(w + 4, xq + 16),
                                                  _mm256_set1_epi32(x.offset16[2 * mb + 1]));
            const __m256 halves = _mm256_fmadd_ps(_mm256_cvtepi32_ps(high), s.scale[1],
                                                  _mm256_mul_ps(_mm256_cvtepi32_ps(low), s.scale[0]));
            acc[h][r] = _mm256_fmadd_ps(halves, step, acc[h][r]);
          } else {  // Q8_0 (signed): no offset, its dot is already sum q x
            const __m256 dot = _mm256_cvtepi32_ps(dot_groups<8, F::kWiden, F::kSigned>(w, xq));
            acc[h][r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(s.scale[0], step), acc[h][r]);
          }
        }
      }
    }
  }
  finish_sums<kRows, kSpan>(acc, out + m0 * ld_out, ld_out, half, cols, bias);
}

// The 4-bit formats: the rows inside the loop over a K-block's 4 quant vectors, so that only one vector's two
// nibble groups are live while every row's int16 sum grows (all 8 groups fit in int16: see kWiden), 8 rows' sums in
// registers. Unpacked ahead of the rows as half_rows does, the 8 vectors and 4 rows' sums left too few registers:
// Q4_K at 8-256 rows 1.13-1.15x faster this way (Zen 4, RADIXLM_KERNEL_ISA=avx2; 1-4 rows the same), with the same
// integer sums, so the same bits. GCC's choices decide it: with tile_rows looping over the halves instead of calling
// this twice, it unrolled the quant loop and spilled two rows' sums (0.75x). kSpan halves (from `half`) a pass.
template <class F, int kRows, int kSpan>
RADIXLM_AVX2 void nibble_rows(const uint8_t* tile, const Activations& x, int64_t m0, int half, float* out,
                              int64_t ld_out, int64_t cols, const float* bias, bool accumulate) {
  constexpr int64_t kPerSuper = F::kSuperWeights / kBlock;
  const int64_t blocks = x.k / kBlock;
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256 acc[kSpan][kRows];
  start_sums<kRows, kSpan>(acc, out + m0 * ld_out, ld_out, half, cols, accumulate);
  for (int64_t b0 = 0; b0 < blocks; b0 += kPerSuper, tile += F::kSuperBytes) {
    for (int j = 0; j < kPerSuper; ++j) {
      const int64_t b = b0 + j;
      if (half == 0) prefetch_block<F>(tile, j);
      const int8_t* xq[kRows];
      for (int r = 0; r < kRows; ++r) xq[r] = x.q + ((m0 + r) * x.row_blocks + b) * kBlock;
      for (int h = 0; h < kSpan; ++h) {
        Scales s;
        const uint8_t* quants = F::scales(tile, j, half + h, s);
        __m256i pairs[kRows] = {};  // each set at p == 0 (the initializer only quiets GCC)
        for (int p = 0; p < 4; ++p) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * p + 32 * (half + h)));
          const __m256i low = _mm256_and_si256(v, low4), high = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          for (int r = 0; r < kRows; ++r) {
            const __m256i a = _mm256_maddubs_epi16(low, _mm256_set1_epi32(load_i32(xq[r] + 4 * p)));
            const __m256i c = _mm256_maddubs_epi16(high, _mm256_set1_epi32(load_i32(xq[r] + 4 * p + 16)));
            pairs[r] = p == 0 ? _mm256_add_epi16(a, c) : _mm256_add_epi16(pairs[r], _mm256_add_epi16(a, c));
          }
        }
        for (int r = 0; r < kRows; ++r) {
          const int64_t mb = (m0 + r) * x.row_blocks + b;
          const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1)));
          acc[h][r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(s.scale[0], _mm256_set1_ps(x.step[mb])), acc[h][r]);
          acc[h][r] = _mm256_fmadd_ps(s.offset, _mm256_set1_ps(x.sum32[mb]), acc[h][r]);
        }
      }
    }
  }
  finish_sums<kRows, kSpan>(acc, out + m0 * ld_out, ld_out, half, cols, bias);
}

// A chunk of rows times the tile: one pass over both halves up to kPairedRows rows, else a pass a half (each pass
// holds kSpan x kRows sums in registers). A pass a half reads every cache line of the tile in the first pass while it
// uses half of each, so that pass waits on memory and the second runs from L1 with memory idle; one pass keeps the
// stream and the arithmetic together. At 1 row from memory (1B Q4_K_M tensors, Zen 3, 2 threads) Q4_K 19-22 against
// 15-18 GB/s, Q6_K 19-24 against 17-19; a batch-1 step of the 1B file 34.2-34.7 against 41.1-46.6 ms. At 3-4 rows the
// paired sums spill (Q4_K 0.7-0.9x), so those take a pass a half. The sums per column are the same either way.
template <class F, int kRows>
RADIXLM_AVX2 void tile_rows(const uint8_t* tile, const Activations& x, int64_t m0, float* out, int64_t ld_out,
                            int64_t cols, const float* bias, bool accumulate) {
  if constexpr (kRows <= kPairedRows && F::kNibbles) {
    nibble_rows<F, kRows, 2>(tile, x, m0, 0, out, ld_out, cols, bias, accumulate);
  } else if constexpr (kRows <= kPairedRows) {
    half_rows<F, kRows, 2>(tile, x, m0, 0, out, ld_out, cols, bias, accumulate);
  } else if constexpr (F::kNibbles) {
    nibble_rows<F, kRows, 1>(tile, x, m0, 0, out, ld_out, cols, bias, accumulate);
    if (cols > 8) nibble_rows<F, kRows, 1>(tile, x, m0, 1, out, ld_out, cols, bias, accumulate);
  } else {
    half_rows<F, kRows, 1>(tile, x, m0, 0, out, ld_out, cols, bias, accumulate);
    if (cols > 8) half_rows<F, kRows, 1>(tile, x, m0, 1, out, ld_out, cols, bias, accumulate);
  }
}

// A call's rows (at most kChunkRows, gguf_kernels.h) in one pass of tile_rows.
template <class F>
RADIXLM_AVX2 void tile_kernel(const uint8_t* tile, const Activations& x, int64_t m0, int64_t rows, float* out,
                              int64_t ld_out, int64_t cols, const float* bias, bool accumulate) {
  for (; rows >= kChunkRows; rows -= kChunkRows, m0 += kChunkRows) {
    tile_rows<F, kChunkRows>(tile, x, m0, out, ld_out, cols, bias, accumulate);
  }
  switch (rows) {
    case 1: return tile_rows<F, 1>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 2: return tile_rows<F, 2>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 3: return tile_rows<F, 3>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 4: return tile_rows<F, 4>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 5: return tile_rows<F, 5>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 6: return tile_rows<F, 6>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    case 7: return tile_rows<F, 7>(tile, x, m0, out, ld_out, cols, bias, accumulate);
    default: return;
  }
}

}  // namespace

TileKernel avx2_kernel(int64_t type) {
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
