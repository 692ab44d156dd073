// The GGUF linear's AVX2 + FMA + F16C kernels (see gguf_kernels.h). Every function that uses the intrinsics carries
// the target attribute, so this file builds and the rest of the extension stays portable whatever the build's
// -march; linear_gguf.cpp calls them only after cpu_has_avx2(). (No `#pragma GCC target` over the file: inline
// functions from the headers would then be compiled for AVX2 too, and the linker may keep those copies.)
//
// Each format is a policy over chunks of 32 weights: `prepare(block)` reads a block's scales once, `raw(block, chunk,
// q)` gives a chunk's quants as 4 vectors of integer floats, and weight w = scale(chunk, vector) * q + offset(chunk).
// The fused kernel (a few rows) multiplies the quants with the activations first and scales each chunk's sums
// once, the offset times the chunk's sum of activations added aside: per chunk and row, 5 multiply-adds instead of
// 8, which at one row made the nibble formats about a fifth faster. The decoder (more rows) writes the weights to
// the L1 buffer.

#include "gguf_kernels.h"

#include <immintrin.h>

#define RADIXLM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace radixlm_gguf {
namespace {

// Blocks are requested this far ahead of the one being unpacked: with the hardware prefetcher alone a core unpacked
// Q8_0 rows from DRAM at about half the rate it reached on rows in L2 (6.6 against 12.9 G weights/s at one row on
// Zen 2); with it, within a few percent.
constexpr int64_t kPrefetchBytes = 2048;

RADIXLM_AVX2 inline float half_at(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }

// Requests the cache lines of the block kPrefetchBytes after `block` (past a row's end: the next row's, or nothing
// harmful, as a prefetch never faults).
template <class F>
RADIXLM_AVX2 inline void prefetch_ahead(const uint8_t* block) {
  for (int64_t line = 0; line < F::kBytes; line += 64) __builtin_prefetch(block + kPrefetchBytes + line, 0, 0);
}

// 8 bytes at p, zero- or sign-extended to 8 int32 lanes (one load-and-extend instruction).
RADIXLM_AVX2 inline __m256i bytes8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
RADIXLM_AVX2 inline __m256i signed_bytes8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

RADIXLM_AVX2 inline __m256 to_float(__m256i q) { return _mm256_cvtepi32_ps(q); }

// Q8_0: d (f16), 32 int8; w = q d.
struct Q8_0 {
  static constexpr int64_t kBytes = 34, kChunks = 1;
  static constexpr int kScales = 1;  // per chunk
  static constexpr bool kOffset = false;
  struct Scales { __m256 d; };
  RADIXLM_AVX2 static Scales prepare(const uint8_t* b) { return {_mm256_set1_ps(half_at(b))}; }
  RADIXLM_AVX2 static void raw(const uint8_t* b, int, __m256* q) {
    for (int j = 0; j < 4; ++j) q[j] = to_float(signed_bytes8(b + 2 + 8 * j));
  }
  RADIXLM_AVX2 static __m256 scale(const Scales& s, int, int) { return s.d; }
  static float offset(const Scales&, int) { return 0.f; }
};

// Q4_0 / Q4_1: d (f16) (, m (f16)), 16 bytes: weight i < 16 in the low nibble of byte i, 16 + i in its high one.
// Q4_0: w = d (q - 8) = d q + (-8 d), both exact; Q4_1: w = d q + m.
template <bool kMin>
struct Q4Legacy {
  static constexpr int64_t kBytes = kMin ? 20 : 18, kChunks = 1;
  static constexpr int kScales = 1;
  static constexpr bool kOffset = true;
  struct Scales { __m256 d; float offset; };
  RADIXLM_AVX2 static Scales prepare(const uint8_t* b) {
    const float d = half_at(b);
    return {_mm256_set1_ps(d), kMin ? half_at(b + 2) : -8.f * d};
  }
  RADIXLM_AVX2 static void raw(const uint8_t* b, int, __m256* q) {
    const __m256i low4 = _mm256_set1_epi32(15);
    const __m256i q0 = bytes8(b + kBytes - 16), q1 = bytes8(b + kBytes - 8);
    q[0] = to_float(_mm256_and_si256(q0, low4));
    q[1] = to_float(_mm256_and_si256(q1, low4));
    q[2] = to_float(_mm256_srli_epi32(q0, 4));
    q[3] = to_float(_mm256_srli_epi32(q1, 4));
  }
  RADIXLM_AVX2 static __m256 scale(const Scales& s, int, int) { return s.d; }
  static float offset(const Scales& s, int) { return s.offset; }
};

// Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes: group g of 32 bytes holds chunk 2g in its low
// nibbles and 2g + 1 in its high ones; w = (d scale) q - (dmin min) per chunk.
struct Q4_K {
  static constexpr int64_t kBytes = 144, kChunks = 8;
  static constexpr int kScales = 1;
  static constexpr bool kOffset = true;
  struct Scales { alignas(32) float scale[8], offset[8]; };
  RADIXLM_AVX2 static Scales prepare(const uint8_t* b) {
    const Q4KScales packed = q4_k_scales(b + 4);
    const __m256 scales = to_float(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(packed.scales)));
    const __m256 mins = to_float(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(packed.mins)));
    Scales s;  // -(dmin min) as (-dmin) min: the same float
    _mm256_store_ps(s.scale, _mm256_mul_ps(_mm256_set1_ps(half_at(b)), scales));
    _mm256_store_ps(s.offset, _mm256_mul_ps(_mm256_set1_ps(-half_at(b + 2)), mins));
    return s;
  }
  RADIXLM_AVX2 static void raw(const uint8_t* b, int chunk, __m256* q) {
    const uint8_t* bytes = b + 16 + 32 * (chunk / 2);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = bytes8(bytes + 8 * j);
      q[j] = to_float(chunk % 2 == 0 ? _mm256_and_si256(v, _mm256_set1_epi32(15)) : _mm256_srli_epi32(v, 4));
    }
  }
  RADIXLM_AVX2 static __m256 scale(const Scales& s, int chunk, int) { return _mm256_broadcast_ss(s.scale + chunk); }
  static float offset(const Scales& s, int chunk) { return s.offset[chunk]; }
};

// Q6_K: 128 bytes of low nibbles, 64 of 2-bit pairs, 16 int8 scales, d (f16). Chunk 4h + s of half h takes the low
// (s < 2) or high nibble of ql[64 h + 32 (s % 2) + i] and bits 2s, 2s + 1 of qh[32 h + i]; w = (d scale) (q - 32)
// with a scale per 16 weights (q - 32 taken exactly in the bytes).
struct Q6_K {
  static constexpr int64_t kBytes = 210, kChunks = 8;
  static constexpr int kScales = 2;
  static constexpr bool kOffset = false;
  struct Scales { alignas(32) float scale[16]; };
  RADIXLM_AVX2 static Scales prepare(const uint8_t* b) {
    const __m256 d = _mm256_set1_ps(half_at(b + 208));
    Scales s;
    for (int i = 0; i < 2; ++i) _mm256_store_ps(s.scale + 8 * i, _mm256_mul_ps(d, to_float(signed_bytes8(b + 192 + 8 * i))));
    return s;
  }
  RADIXLM_AVX2 static void raw(const uint8_t* b, int chunk, __m256* q) {
    const int h = chunk / 4, sub = chunk % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (sub % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    // Bytes moved by 16-bit shifts; the bits that cross into the neighbouring byte are masked off.
    const __m256i low = _mm256_and_si256(sub < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(15));
    const __m256i pair = sub == 0 ? _mm256_slli_epi16(qh, 4) : sub == 1 ? _mm256_slli_epi16(qh, 2)
                         : sub == 2 ? qh : _mm256_srli_epi16(qh, 2);  // bits 2 sub, 2 sub + 1 at bits 4, 5
    const __m256i high = _mm256_and_si256(pair, _mm256_set1_epi8(0x30));
    const __m256i centered = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));  // q - 32
    const __m128i lo = _mm256_castsi256_si128(centered), hi = _mm256_extracti128_si256(centered, 1);
    const __m128i v[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    for (int j = 0; j < 4; ++j) q[j] = to_float(_mm256_cvtepi8_epi32(v[j]));
  }
  RADIXLM_AVX2 static __m256 scale(const Scales& s, int chunk, int vector) {
    return _mm256_broadcast_ss(s.scale + 2 * chunk + vector / 2);
  }
  static float offset(const Scales&, int) { return 0.f; }
};

// Decode's contract: each weight rounded once, scale * q + offset (for Q4_0, Q8_0, Q6_K: the reference's own value).
template <class F>
RADIXLM_AVX2 void decode(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += F::kBytes) {
    prefetch_ahead<F>(src);
    const typename F::Scales scales = F::prepare(src);
#pragma GCC unroll 8  // constant chunks: the formats' per-chunk choices of bytes and shifts fold away
    for (int c = 0; c < F::kChunks; ++c, dst += 32) {
      __m256 q[4];
      F::raw(src, c, q);
      const __m256 offset = _mm256_set1_ps(F::offset(scales, c));
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(dst + 8 * j, _mm256_fmadd_ps(q[j], F::scale(scales, c, j), offset));
    }
  }
}

RADIXLM_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Fused's contract for kRows rows, the weights factored: sum_k w_k x_k = sum over chunks of scale * (sum q x) +
// offset * (sum x), the quants' products summed in registers before one multiply-add by the scale.
template <class F, int kRows>
RADIXLM_AVX2 void fused_rows(const uint8_t* src, int64_t blocks, const float* x, int64_t ldx, const float* xsum,
                             float* out, int64_t ld_out) {
  constexpr int kPerScale = 4 / F::kScales;  // vectors of a chunk under one scale
  const int64_t ld_xsum = blocks * F::kChunks;
  __m256 acc[kRows];
  float offsets[kRows] = {};
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, src += F::kBytes) {
    prefetch_ahead<F>(src);
    const typename F::Scales scales = F::prepare(src);
#pragma GCC unroll 8
    for (int c = 0; c < F::kChunks; ++c, x += 32, ++xsum) {
      __m256 q[4];
      F::raw(src, c, q);
      for (int r = 0; r < kRows; ++r) {
        const float* row = x + r * ldx;
        for (int g = 0; g < F::kScales; ++g) {
          const int first = g * kPerScale;
          __m256 sum = _mm256_mul_ps(q[first], _mm256_loadu_ps(row + 8 * first));
          for (int j = first + 1; j < first + kPerScale; ++j) sum = _mm256_fmadd_ps(q[j], _mm256_loadu_ps(row + 8 * j), sum);
          acc[r] = _mm256_fmadd_ps(F::scale(scales, c, first), sum, acc[r]);
        }
        if (F::kOffset) offsets[r] += F::offset(scales, c) * xsum[r * ld_xsum];
      }
    }
  }
  for (int r = 0; r < kRows; ++r) out[r * ld_out] = hsum(acc[r]) + offsets[r];
}

template <class F>
RADIXLM_AVX2 void fused(const uint8_t* src, int64_t blocks, const float* x, int64_t ldx, const float* xsum,
                        int64_t rows, float* out, int64_t ld_out) {
  switch (rows) {
    case 1: return fused_rows<F, 1>(src, blocks, x, ldx, xsum, out, ld_out);
    case 2: return fused_rows<F, 2>(src, blocks, x, ldx, xsum, out, ld_out);
    case 3: return fused_rows<F, 3>(src, blocks, x, ldx, xsum, out, ld_out);
    default: return fused_rows<F, 4>(src, blocks, x, ldx, xsum, out, ld_out);
  }
}

// Dot's contract for kRows activation rows and kTile weight rows, accumulated in registers (2 x 4 accumulators,
// 4 weight vectors and an activation vector fit AVX2's 16 registers).
template <int kRows, int kTile>
RADIXLM_AVX2 void dot_group(const float* x, int64_t ldx, const float* w, int64_t len, float* partial) {
  __m256 acc[kRows][kTile];
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kTile; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < len; k += 8) {
    __m256 wv[kTile];
    for (int t = 0; t < kTile; ++t) wv[t] = _mm256_loadu_ps(w + t * kSpan + k);
    for (int r = 0; r < kRows; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
      for (int t = 0; t < kTile; ++t) acc[r][t] = _mm256_fmadd_ps(xv, wv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kTile; ++t) partial[r * kTileRows + t] += hsum(acc[r][t]);
  }
}

template <int kTile>
RADIXLM_AVX2 void dot_rows(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t len, float* partial) {
  int64_t m = 0;
  for (; m + 2 <= rows; m += 2) dot_group<2, kTile>(x + m * ldx, ldx, w, len, partial + m * kTileRows);
  if (m < rows) dot_group<1, kTile>(x + m * ldx, ldx, w, len, partial + m * kTileRows);
}

RADIXLM_AVX2 void dot(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t tile_rows, int64_t len,
                      float* partial) {
  if (tile_rows == kTileRows) return dot_rows<kTileRows>(x, ldx, rows, w, len, partial);
  for (int64_t t = 0; t < tile_rows; ++t) dot_rows<1>(x, ldx, rows, w + t * kSpan, len, partial + t);
}

template <class F>
Kernels kernels_of() {
  return {decode<F>, dot, fused<F>};
}

}  // namespace

Kernels avx2_kernels(int64_t type) {
  switch (type) {
    case kQ8_0: return kernels_of<Q8_0>();
    case kQ4_0: return kernels_of<Q4Legacy<false>>();
    case kQ4_1: return kernels_of<Q4Legacy<true>>();
    case kQ4_K: return kernels_of<Q4_K>();
    case kQ6_K: return kernels_of<Q6_K>();
    default: return {nullptr, nullptr, nullptr};
  }
}

bool cpu_has_avx2() {
  // libgcc's checks include the OS's XSAVE support for the YMM state.
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

}  // namespace radixlm_gguf
