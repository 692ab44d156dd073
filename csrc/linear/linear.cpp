// Float32 linear layers for a few rows (decode at small batch): y = x W^T (+ b) with W [N, K] row-major, x [..., K]
// holding M <= kMaxRows rows. (The int8 kernel is in linear_int8.cpp.)
//
// At one row a linear layer is a matrix-vector product that must read every weight once: it is bound by memory
// bandwidth, not arithmetic. A general GEMM at M = 1 pays packing and blocking meant for large M; here each thread
// takes a contiguous range of output channels and streams their weight rows once, four rows side by side (four
// independent memory streams), against every input row held in L1.

#include "linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernel_checks.h"
#include "vec16.h"

namespace {

constexpr int64_t kMaxRows = 9;  // a decode verifying up to 8 draft tokens

using radixlm_vec::hsum;
using radixlm_vec::load16;
using radixlm_vec::v16f;

// out[m, n0 .. n0 + kTileN) for all rows m of x, from weight rows n0 .. (exactly kTileN of them).
template <int64_t kRows, int64_t kTileN>
inline void gemv_tile(const float* x, int64_t k_dim, const float* w, float* out, int64_t ld_out) {
  v16f acc[kRows][kTileN] = {};
  const int64_t k_vec = k_dim / 16 * 16;
  for (int64_t k = 0; k < k_vec; k += 16) {
    v16f wv[kTileN];
    for (int64_t t = 0; t < kTileN; ++t) wv[t] = load16(w + t * k_dim + k);
    for (int64_t m = 0; m < kRows; ++m) {
      const v16f xv = load16(x + m * k_dim + k);
      for (int64_t t = 0; t < kTileN; ++t) acc[m][t] += xv * wv[t];
    }
  }
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t t = 0; t < kTileN; ++t) {
      float s = hsum(acc[m][t]);
      for (int64_t k = k_vec; k < k_dim; ++k) s += x[m * k_dim + k] * w[t * k_dim + k];
      out[m * ld_out + t] = s;
    }
  }
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

template <int64_t kRows, int64_t kTileN>
void gemv_range(const float* x, const float* w, const float* bias, float* out, int64_t n_dim, int64_t k_dim,
                int64_t n_begin, int64_t n_end) {
  int64_t n = n_begin;
  for (; n + kTileN <= n_end; n += kTileN) gemv_tile<kRows, kTileN>(x, k_dim, w + n * k_dim, out + n, n_dim);
  for (; n < n_end; ++n) gemv_row<kRows>(x, k_dim, w + n * k_dim, out + n, n_dim);
  if (bias != nullptr) {
    for (int64_t m = 0; m < kRows; ++m) {
      for (n = n_begin; n < n_end; ++n) out[m * n_dim + n] += bias[n];
    }
  }
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
#if RADIXLM_VEC16_HALVES
    // 16 AVX2 registers of 8 lanes: 4 weight rows side by side for one input row, 2 for more, and rows 3 at a time
    // (each pass reads the tile's weight rows again, from L2). A row's sums are the same whatever the tile.
    if (m_dim == 1) return gemv_range<1, 4>(xp, wp, bp, op, n_dim, k_dim, begin, end);
    for (int64_t m0 = 0; m0 < m_dim; m0 += 3) {
      const float* x_rows = xp + m0 * k_dim;
      float* out_rows = op + m0 * n_dim;
      switch (std::min<int64_t>(3, m_dim - m0)) {
        case 1: gemv_range<1, 2>(x_rows, wp, bp, out_rows, n_dim, k_dim, begin, end); break;
        case 2: gemv_range<2, 2>(x_rows, wp, bp, out_rows, n_dim, k_dim, begin, end); break;
        default: gemv_range<3, 2>(x_rows, wp, bp, out_rows, n_dim, k_dim, begin, end); break;
      }
    }
#else
    // 16 weight rows side by side for one or two input rows, 8 for more (their accumulators must fit in registers).
    switch (m_dim) {
      case 1: gemv_range<1, 16>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      case 2: gemv_range<2, 16>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      case 3: gemv_range<3, 8>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      case 4: gemv_range<4, 8>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      case 5: gemv_range<5, 4>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      case 6: gemv_range<6, 4>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      case 7: gemv_range<7, 2>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      case 8: gemv_range<8, 2>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
      default: gemv_range<9, 2>(xp, wp, bp, op, n_dim, k_dim, begin, end); break;
    }
#endif
  });
  return out;
}
