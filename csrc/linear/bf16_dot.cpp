// A bfloat16 linear for the few rows of a decode step on AVX-512 BF16 (vdpbf16ps), on the plain nn.Linear weight.
//
// Why our own: on a CPU with the bfloat16 dot product but no AMX (a Zen 4), oneDNN's linear on its prepacked weights
// took 2.5x the weight-read bound of a batch-1 step of the default model (19.8 against 7.9 ms, `bench step`), though
// hot in cache it is near the bound. This loop streams each thread's share of the weight front to back, four (one
// input row: eight) weight rows side by side, and multiplies each group of weight rows by every input row while
// they are in L1: per 32 inputs, one dot-product instruction per (input row, weight row) pair, then one horizontal
// sum per output. Same layout as the AMX kernel (amx_bf16.cpp) and radixlm/model/bf16_linear.py chooses between
// them; the weight stays [N, K], so an LM head tied to the embedding needs no copy.
#include "bf16_dot.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "../bf16_vec.h"
#include "../isa.h"
#include "../kernel_checks.h"

namespace {

constexpr int64_t kStep = 32;  // inputs per dot-product instruction

struct Problem {
  const uint16_t* x;
  const uint16_t* w;
  const float* bias;  // null: none
  uint16_t* out;
  int64_t rows, n_dim, k_dim;
};

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// The four sums of a0..a3's lanes, in order.
RADIXLM_AVX512_BF16 inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
  __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)), _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
  u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0x4E));  // 128-bit lanes 2, 3, 0, 1
  u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0xB1));  // 1, 0, 3, 2
  return _mm512_castps512_ps128(u);
}

// out[m0 .. m0 + kRows, n0 .. n0 + kCols) from weight rows n0 .. and input rows m0 ..; `prefetch`: fetch the next
// kCols weight rows meanwhile (the first tile of a group of weight rows reads them from memory).
template <int kRows, int kCols>
RADIXLM_AVX512_BF16 void tile(const Problem& p, int64_t m0, int64_t n0, bool prefetch) {
  __m512 acc[kRows][kCols];
  for (int m = 0; m < kRows; ++m) {
    for (int c = 0; c < kCols; ++c) acc[m][c] = _mm512_setzero_ps();
  }
  const uint16_t* w = p.w + n0 * p.k_dim;
  const uint16_t* x = p.x + m0 * p.k_dim;
  for (int64_t k = 0; k < p.k_dim; k += kStep) {
    __m512bh weights[kCols];
    for (int c = 0; c < kCols; ++c) {
      weights[c] = as_bh(_mm512_loadu_si512(w + c * p.k_dim + k));
      if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(w + (c + kCols) * p.k_dim + k), _MM_HINT_T0);
    }
    for (int m = 0; m < kRows; ++m) {
      const __m512bh input = as_bh(_mm512_loadu_si512(x + m * p.k_dim + k));
      for (int c = 0; c < kCols; ++c) acc[m][c] = _mm512_dpbf16_ps(acc[m][c], input, weights[c]);
    }
  }
  for (int m = 0; m < kRows; ++m) {
    uint16_t* out = p.out + (m0 + m) * p.n_dim + n0;
    if constexpr (kCols % 4 == 0) {
      for (int c = 0; c < kCols; c += 4) {
        __m128 sums = sum4(acc[m][c], acc[m][c + 1], acc[m][c + 2], acc[m][c + 3]);
        if (p.bias != nullptr) sums = _mm_add_ps(sums, _mm_loadu_ps(p.bias + n0 + c));
        alignas(16) float values[4];
        _mm_store_ps(values, sums);
        for (int i = 0; i < 4; ++i) out[c + i] = radixlm_bf16::to_bf16(values[i]);
      }
    } else {
      for (int c = 0; c < kCols; ++c) {
        const float sum = _mm512_reduce_add_ps(acc[m][c]);
        out[c] = radixlm_bf16::to_bf16(p.bias != nullptr ? sum + p.bias[n0 + c] : sum);
      }
    }
  }
}

template <int kCols>
RADIXLM_AVX512_BF16 void column_group(const Problem& p, int64_t n0) {
  int64_t m0 = 0;
  for (; m0 + 4 <= p.rows; m0 += 4) tile<4, kCols>(p, m0, n0, true);
  switch (p.rows - m0) {
    case 3: tile<3, kCols>(p, m0, n0, true); break;
    case 2: tile<2, kCols>(p, m0, n0, true); break;
    case 1: tile<1, kCols>(p, m0, n0, true); break;
    default: break;
  }
}

RADIXLM_AVX512_BF16 void columns(const Problem& p, int64_t begin, int64_t end) {
  int64_t n = begin;
  if (p.rows == 1) {
    for (; n + 8 <= end; n += 8) tile<1, 8>(p, 0, n, true);
  }
  for (; n + 4 <= end; n += 4) column_group<4>(p, n);
  for (; n < end; ++n) column_group<1>(p, n);
}

}  // namespace

namespace radixlm {

bool bf16_dot_available() { return isa::cpu_has_avx512_bf16(); }

at::Tensor bf16_dot_linear(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(bf16_dot_available(), "bf16_dot_linear needs a CPU with AVX-512 BF16");
  check_dense_cpu(input, "x");
  check_dense_cpu(weight, "weight");
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && input.dim() >= 1, "x must be bfloat16 [..., K]");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 2 && weight.is_contiguous(),
              "weight must be contiguous bfloat16 [N, K]");
  const int64_t n_dim = weight.size(0), k_dim = weight.size(1);
  TORCH_CHECK(input.size(-1) == k_dim, "x has ", input.size(-1), " features, weight ", k_dim);
  TORCH_CHECK(k_dim % kStep == 0, "in_features must be a multiple of ", kStep, ", got ", k_dim);
  at::Tensor float_bias;
  if (bias.has_value()) {
    check_dense_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n_dim, "bias must be [N]");
    float_bias = bias->to(at::kFloat).contiguous();
  }
  const at::Tensor x = input.contiguous();
  at::Tensor out = empty_output(x, n_dim);
  const int64_t rows = k_dim == 0 ? 0 : x.numel() / k_dim;
  if (rows == 0 || n_dim == 0) return out;
  const Problem p{reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()),
                  reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()),
                  float_bias.defined() ? float_bias.data_ptr<float>() : nullptr,
                  reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), rows, n_dim, k_dim};
  // Grain in whole groups of 8 weight rows, at least kGrainBytes of weight a task.
  const int64_t grain = (grain_rows(k_dim * 2) + 7) / 8 * 8;
  at::parallel_for(0, n_dim, grain, [&](int64_t begin, int64_t end) { columns(p, begin, end); });
  return out;
}

}  // namespace radixlm
