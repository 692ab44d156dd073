// Float32 linear layers for a few rows (decode at small batch): y = x W^T (+ b) with W [N, K] row-major, x [..., K]
// holding M <= kMaxRows rows. (The int8 kernel is in linear_int8.cpp.)
//
// At one row a linear layer is a matrix-vector product that must read every weight once: it is bound by memory
// bandwidth, not arithmetic. A general GEMM at M = 1 pays packing and blocking meant for large M; here each thread
// takes a contiguous range of output channels and streams their weight rows once, a tile of several rows side by
// side, against every input row held in L1 or L2; software prefetch requests the next tile while one is multiplied.
// Each output is the sum of 16 lane sums over K, added in lane order (hsum's order), so a row's result does not
// depend on the tile, the rows beside it or the threads.

#include "linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernel_checks.h"
#include "transpose16.h"
#include "vec16.h"

// GCC 12 reports the undefined pass-through operands inside its own AVX-512 intrinsics (the shuffles of lane_sums) as
// uninitialized once they are inlined here: false positives of the header (as in gguf_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

// Above kMaxRows PyTorch's GEMM runs (radixlm.model.small_batch.MAX_ROWS). The default model's decode steps in float32
// (`radixlm bench step`, this Zen 4, against MKL above 9 rows before): 8 rows 47-49 -> 32-34 ms, 16 88-100 -> 55-57,
// 32 125-140 -> 88-89, 64 195-227 -> 159 (MKL on this AMD CPU: 50-115 GFLOP/s at 16 rows).
constexpr int64_t kMaxRows = 64;
// Above kSingleGroupRows rows x is taken in groups of kGroupRows against tiles of kGroupTileN weight rows, each tile
// read from memory once and then from L1 or L2 by every group.
constexpr int64_t kSingleGroupRows = 9;
constexpr int64_t kGroupRows = RADIXLM_VEC16_HALVES ? 3 : 8;
constexpr int64_t kGroupTileN = 2;
// The AVX2 build's tiles by halves (halves_tile): groups of 6 rows, up to 2,048 features. Against the 3-row v16f
// passes (two AVX2 threads on this Zen 4): 1.3-1.7x on 576 features at 4-64 rows, level on 2,048, 0.7x at 4-8 rows
// on 8,192.
constexpr int64_t kHalvesGroupRows = 6;
constexpr int64_t kHalvesMaxK = 2048;
// Up to this many features each row of x is loaded once a step into a register (gemv_tile's kXInRegister).
constexpr int64_t kRegisterXMaxK = 1536;

using radixlm_vec::hsum;
using radixlm_vec::load16;
using radixlm_vec::v16f;

// sums[i] = hsum(acc[i]) for i < count (a multiple of 16 in the AVX-512 build: the lanes of 16 accumulators are
// transposed in registers and added column by column, the same additions in the same order as hsum's).
inline void lane_sums(const v16f* acc, int64_t count, float* sums) {
#if RADIXLM_BUILD_AVX512
  for (int64_t i0 = 0; i0 < count; i0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = reinterpret_cast<const __m512&>(acc[i0 + i]);
    radixlm::transpose16(r);  // r[c]: lane c of the 16 accumulators
    __m512 s = _mm512_setzero_ps();
    for (int c = 0; c < 16; ++c) s = _mm512_add_ps(s, r[c]);
    _mm512_storeu_ps(sums + i0, s);
  }
#else
  for (int64_t i = 0; i < count; ++i) sums[i] = hsum(acc[i]);
#endif
}

// out[m, n0 .. n0 + kTileN) for all rows m of x, from weight rows n0 .. (exactly kTileN of them). `ahead`: the bytes
// from w to prefetch into L2 at, swept at the rate this tile is read (the next tile's, when it is one tile's size;
// with the hardware prefetcher alone the 49,152 x 576 LM head streamed at 6.7 GB/s at 8 rows on one thread, with
// this 13.9).
// kXInRegister: each row of x loaded once a step and kept in a register; otherwise GCC folds the load into every
// multiply-add as a memory operand, and the loads, not the multiply-adds, bound the loop. Measured (one thread, this
// Zen 4) 1.1-1.2x at 8-64 rows on 576 and 1,536 features, but from 0.7x to 1.6x on 2,048-8,192 (x in L2): only
// up to kRegisterXMaxK.
template <int64_t kRows, int64_t kTileN, bool kXInRegister>
inline void gemv_tile(const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out, int64_t ahead) {
  constexpr int64_t kCount = (kRows * kTileN + 15) / 16 * 16;
  v16f acc[kCount] = {};
  const int64_t k_vec = k_dim / 16 * 16;
  const char* sweep = reinterpret_cast<const char*>(w) + ahead;
  for (int64_t k = 0; k < k_vec; k += 16) {
    for (int64_t t = 0; t < kTileN; ++t) _mm_prefetch(sweep + (k * kTileN + 16 * t) * 4, _MM_HINT_T1);
    v16f wv[kTileN];
    for (int64_t t = 0; t < kTileN; ++t) wv[t] = load16(w + t * k_dim + k);
    for (int64_t m = 0; m < kRows; ++m) {
      v16f xv = load16(x + m * k_dim + k);
#if !RADIXLM_VEC16_HALVES
      if constexpr (kXInRegister) asm("" : "+v"(xv));
#endif
      for (int64_t t = 0; t < kTileN; ++t) acc[m * kTileN + t] += xv * wv[t];
    }
  }
  float sums[kCount];
  lane_sums(acc, kCount, sums);
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t t = 0; t < kTileN; ++t) {
      float s = sums[m * kTileN + t];
      for (int64_t k = k_vec; k < k_dim; ++k) s += x[m * k_dim + k] * w[t * k_dim + k];
      out[m * ld_out + t] = s;
    }
  }
}

template <int64_t kRows, int64_t kTileN>
inline void multiply_tile(const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out, int64_t ahead) {
  if (k_dim <= kRegisterXMaxK) return gemv_tile<kRows, kTileN, true>(x, k_dim, w, out, ld_out, ahead);
  gemv_tile<kRows, kTileN, false>(x, k_dim, w, out, ld_out, ahead);
}

template <int64_t kRows>
inline void gemv_row(const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out) {
  for (int64_t m = 0; m < kRows; ++m) {
    v16f acc = {};
    const int64_t k_vec = k_dim / 16 * 16;
    for (int64_t k = 0; k < k_vec; k += 16) acc += load16(x + m * k_dim + k) * load16(w + k);
    float s = hsum(acc);
    for (int64_t k = k_vec; k < k_dim; ++k) s += x[m * k_dim + k] * w[k];
    out[m * ld_out] = s;
  }
}

// Rows x (m_dim of them) times weight rows [n_begin, n_end), without the bias.
template <int64_t kRows, int64_t kTileN>
void gemv_range(const float* x, const float* w, float* out, int64_t n_dim, int64_t k_dim, int64_t n_begin,
                int64_t n_end) {
  int64_t n = n_begin;
  const int64_t tile_bytes = kTileN * k_dim * 4;
  for (; n + kTileN <= n_end; n += kTileN) {
    multiply_tile<kRows, kTileN>(x, k_dim, w + n * k_dim, out + n, n_dim, tile_bytes);
  }
  for (; n < n_end; ++n) gemv_row<kRows>(x, k_dim, w + n * k_dim, out + n, n_dim);
}

#if RADIXLM_VEC16_HALVES
// The AVX2 build's group tile: a 16-lane sum's lanes 0-7 and 8-15 in two passes over K with one 8-lane register each
// (the sums of v16f's two halves, added in the same order), so kRows x kTileN accumulators fit the 16 registers
// (as v16f pairs, 3 x 2 of them spilled). The tile's rows are read from L1 or L2 by the second pass.
template <int64_t kRows, int64_t kTileN>
inline void halves_tile(const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out, int64_t ahead) {
  constexpr int64_t kCount = kRows * kTileN;
  constexpr int64_t kSliceK = 512;  // both passes over one slice of K while its x and w (16 KB at most) are in L1
  float lanes[kCount][16] = {};
  const int64_t k_vec = k_dim / 16 * 16;
  const char* sweep = reinterpret_cast<const char*>(w) + ahead;
  for (int64_t k0 = 0; k0 < k_vec; k0 += kSliceK) {
    const int64_t k1 = std::min(k_vec, k0 + kSliceK);
    for (int64_t half = 0; half < 2; ++half) {
      __m256 acc[kCount];
      for (int64_t i = 0; i < kCount; ++i) acc[i] = _mm256_loadu_ps(lanes[i] + 8 * half);
      for (int64_t k = k0 + 8 * half; k < k1; k += 16) {
        if (half == 0) {
          for (int64_t t = 0; t < kTileN; ++t) _mm_prefetch(sweep + (k * kTileN + 16 * t) * 4, _MM_HINT_T1);
        }
        __m256 wv[kTileN];
        for (int64_t t = 0; t < kTileN; ++t) wv[t] = _mm256_loadu_ps(w + t * k_dim + k);
        for (int64_t m = 0; m < kRows; ++m) {
          const __m256 xv = _mm256_loadu_ps(x + m * k_dim + k);
          for (int64_t t = 0; t < kTileN; ++t) acc[m * kTileN + t] = _mm256_fmadd_ps(xv, wv[t], acc[m * kTileN + t]);
        }
      }
      for (int64_t i = 0; i < kCount; ++i) _mm256_storeu_ps(lanes[i] + 8 * half, acc[i]);
    }
  }
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t t = 0; t < kTileN; ++t) {
      float s = 0.f;
      for (int j = 0; j < 16; ++j) s += lanes[m * kTileN + t][j];
      for (int64_t k = k_vec; k < k_dim; ++k) s += x[m * k_dim + k] * w[t * k_dim + k];
      out[m * ld_out + t] = s;
    }
  }
}

// A group of 1 .. kHalvesGroupRows rows against one tile of kGroupTileN weight rows, by halves.
void halves_group_tile(int64_t rows, const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out,
                       int64_t ahead) {
  static_assert(kHalvesGroupRows == 6, "a case for each row count below kHalvesGroupRows");
  switch (rows) {
    case 1: return halves_tile<1, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 2: return halves_tile<2, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 3: return halves_tile<3, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 4: return halves_tile<4, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 5: return halves_tile<5, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    default: return halves_tile<kHalvesGroupRows, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
  }
}

#endif

// A group of 1 .. kGroupRows rows against one tile of kGroupTileN weight rows.
void group_tile(int64_t rows, const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out,
                int64_t ahead) {
  switch (rows) {
    case 1: return multiply_tile<1, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 2: return multiply_tile<2, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
#if !RADIXLM_VEC16_HALVES
    case 3: return multiply_tile<3, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 4: return multiply_tile<4, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 5: return multiply_tile<5, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 6: return multiply_tile<6, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    case 7: return multiply_tile<7, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
    static_assert(kGroupRows == 8, "a case for each row count below kGroupRows");
#else
    static_assert(kGroupRows == 3, "a case for each row count below kGroupRows");
#endif
    default: return multiply_tile<kGroupRows, kGroupTileN>(x, k_dim, w, out, ld_out, ahead);
  }
}

using GroupTile = void (*)(int64_t rows, const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out,
                           int64_t ahead);

// Many rows: each tile of kGroupTileN weight rows against every group of kGroupRows rows of x in turn (the tile read
// from memory once, then from L1 or L2).
void gemv_groups(const float* x, int64_t m_dim, const float* w, float* out, int64_t n_dim, int64_t k_dim,
                 int64_t n_begin, int64_t n_end, int64_t group_rows = kGroupRows, GroupTile tile = group_tile) {
  int64_t n = n_begin;
  const int64_t tile_bytes = kGroupTileN * k_dim * 4;
  for (; n + kGroupTileN <= n_end; n += kGroupTileN) {
    for (int64_t m0 = 0; m0 < m_dim; m0 += group_rows) {
      tile(std::min(group_rows, m_dim - m0), x + m0 * k_dim, k_dim, w + n * k_dim, out + m0 * n_dim + n, n_dim,
           tile_bytes);
    }
  }
  for (; n < n_end; ++n) {
    for (int64_t m = 0; m < m_dim; ++m) gemv_row<1>(x + m * k_dim, k_dim, w + n * k_dim, out + m * n_dim + n, n_dim);
  }
}

void gemv_rows(const float* x, int64_t m_dim, const float* w, float* out, int64_t n_dim, int64_t k_dim,
               int64_t begin, int64_t end) {
#if RADIXLM_VEC16_HALVES
  // 16 AVX2 registers of 8 lanes: 4 weight rows side by side for one input row; for more, tiles of 2 weight rows
  // against 6 rows by halves up to kHalvesMaxK features, 3 rows as v16f pairs above.
  if (m_dim == 1) return gemv_range<1, 4>(x, w, out, n_dim, k_dim, begin, end);
  if (k_dim <= kHalvesMaxK) {
    return gemv_groups(x, m_dim, w, out, n_dim, k_dim, begin, end, kHalvesGroupRows, halves_group_tile);
  }
  gemv_groups(x, m_dim, w, out, n_dim, k_dim, begin, end);
#else
  if (m_dim > kSingleGroupRows) return gemv_groups(x, m_dim, w, out, n_dim, k_dim, begin, end);
  // 16 weight rows side by side for one or two input rows, 8 for more (their accumulators must fit in registers).
  switch (m_dim) {
    case 1: return gemv_range<1, 16>(x, w, out, n_dim, k_dim, begin, end);
    case 2: return gemv_range<2, 16>(x, w, out, n_dim, k_dim, begin, end);
    case 3: return gemv_range<3, 8>(x, w, out, n_dim, k_dim, begin, end);
    case 4: return gemv_range<4, 8>(x, w, out, n_dim, k_dim, begin, end);
    case 5: return gemv_range<5, 4>(x, w, out, n_dim, k_dim, begin, end);
    case 6: return gemv_range<6, 4>(x, w, out, n_dim, k_dim, begin, end);
    case 7: return gemv_range<7, 2>(x, w, out, n_dim, k_dim, begin, end);
    case 8: return gemv_range<8, 2>(x, w, out, n_dim, k_dim, begin, end);
    default: return gemv_range<9, 2>(x, w, out, n_dim, k_dim, begin, end);
  }
#endif
}

}  // namespace

at::Tensor radixlm::small_batch_linear(const at::Tensor& input, const at::Tensor& weight,
                                       const c10::optional<at::Tensor>& bias) {
  const int64_t weight_k = weight.dim() == 2 ? weight.size(1) : -1;
  const int64_t m_dim = radixlm::check_rows(input, weight, weight_k, bias, at::kFloat, kMaxRows);
  const at::Tensor x = input.contiguous();  // no copy when it already is
  const int64_t n_dim = weight.size(0), k_dim = x.size(-1);
  at::Tensor out = radixlm::empty_output(x, n_dim);
  if (m_dim == 0) return out;  // e.g. an LM head with no row to sample
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n_dim, radixlm::grain_rows(k_dim * 4), [&](int64_t begin, int64_t end) {
    gemv_rows(xp, m_dim, wp, op, n_dim, k_dim, begin, end);
    if (bp == nullptr) return;
    for (int64_t m = 0; m < m_dim; ++m) {
      for (int64_t n = begin; n < end; ++n) op[m * n_dim + n] += bp[n];
    }
  });
  return out;
}
