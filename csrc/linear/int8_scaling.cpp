// The per-token scaling around fbgemm's dynamic int8 linear, for radixlm.model.quantize.Int8Linear above the int8
// kernel's rows (linear_int8.cpp): before it, each row divided by its absolute maximum, with the range row
// appended; after it, in place, each output row multiplied back by that maximum, plus the bias. The same numbers as the
// PyTorch ops it replaces (`abs().amax().clamp_min(tiny)`, `/`, `cat`, `* row_max`, `+= bias`): the maximum keeps
// NaN as `amax` does (int8_rows.h), the division is a true division, and the product and the bias sum are rounded apart (no fused
// multiply-add). Those six ops cost 40-100 us a call at 64 rows and about 0.5 ms at 512, where fbgemm itself takes
// 0.3 and 1.3.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "int8_rows.h"
#include "kernel_checks.h"
#include "linear.h"

namespace {

constexpr int64_t kGrainElements = 1 << 16;  // elements per parallel task: small calls stay on the calling thread

// row = row * scale (+ shift), in place, rounded as PyTorch rounds `out * row_max` and then `+= bias`: two steps,
// never one fused multiply-add (a function of its own: the attribute does not reach into a lambda).
__attribute__((optimize("fp-contract=off"))) void rescale_row(float* row, float scale, const float* shift,
                                                               int64_t n_dim) {
  if (shift == nullptr) {
    for (int64_t n = 0; n < n_dim; ++n) row[n] = row[n] * scale;
    return;
  }
  for (int64_t n = 0; n < n_dim; ++n) {
    const float product = row[n] * scale;
    row[n] = product + shift[n];
  }
}

}  // namespace

namespace radixlm {

at::Tensor int8_normalize_rows(const at::Tensor& input, at::Tensor& row_max) {
  check_dense_float_cpu(input, "x");
  check_dense_float_cpu(row_max, "row_max");
  TORCH_CHECK(input.dim() == 2 && input.size(1) >= 2, "x must be [M, K] with K >= 2");
  const int64_t m_dim = input.size(0), k_dim = input.size(1);
  TORCH_CHECK(row_max.numel() == m_dim && row_max.is_contiguous(), "row_max must be contiguous with M elements");
  const at::Tensor x = input.contiguous();
  at::Tensor out = at::empty({m_dim + 1, k_dim}, x.options());
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  float* scales = row_max.data_ptr<float>();
  at::parallel_for(0, m_dim, std::max<int64_t>(1, kGrainElements / k_dim), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* row = src + m * k_dim;
      const float scale = radixlm_int8::row_abs_max(row, k_dim);
      scales[m] = scale;
      float* normalized = dst + m * k_dim;
      for (int64_t i = 0; i < k_dim; ++i) normalized[i] = row[i] / scale;
    }
  });
  float* range_row = dst + m_dim * k_dim;  // fbgemm then sees exactly [-1, 1]
  std::fill(range_row, range_row + k_dim, 0.f);
  range_row[0] = 1.f;
  range_row[k_dim - 1] = -1.f;
  return out;
}

void int8_rescale_rows_(at::Tensor& out, const at::Tensor& row_max, const c10::optional<at::Tensor>& bias) {
  check_dense_float_cpu(out, "out");
  check_dense_float_cpu(row_max, "row_max");
  TORCH_CHECK(out.dim() == 2 && out.size(0) >= 1 && out.is_contiguous(), "out must be contiguous [M + 1, N]");
  const int64_t m_dim = out.size(0) - 1, n_dim = out.size(1);
  TORCH_CHECK(row_max.numel() == m_dim && row_max.is_contiguous(), "row_max must be contiguous with M elements");
  if (bias.has_value()) {
    check_dense_float_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n_dim && bias->is_contiguous(), "bias must be contiguous [N]");
  }
  const float* scales = row_max.data_ptr<float>();
  const float* shift = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* rows = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, n_dim));
  at::parallel_for(0, m_dim, grain, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) rescale_row(rows + m * n_dim, scales[m], shift, n_dim);
  });
}

}  // namespace radixlm
