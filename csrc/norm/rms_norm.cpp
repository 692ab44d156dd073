// RMSNorm for the fused decoder layers (radixlm.model.fused_ops.FusedRMSNorm): the numbers of transformers' float32
// RMSNorm, `weight * (x * rsqrt(mean(x * x) + eps))`, bit for bit, in one call; and for bfloat16 rows the numbers
// of `F.rms_norm` on them (float32 arithmetic, one rounding to bfloat16 at the end), to float32 rounding.
//
// PyTorch's own `F.rms_norm` runs that formula as about ten ATen ops (pow, sum, div, add, rsqrt, two products and
// their allocations), about 7 us per call on this CPU at one row, 61 calls per decode step of the default model.
// Here the elementwise steps are plain loops, each rounded as PyTorch rounds it (one product or sum at a time, no
// fused multiply-add), and the one step whose rounding depends on an order, the sum of squares, is PyTorch's own
// `at::sum` over the same contiguous rows that `mean` reduces. The test compares every output bit with
// transformers' module.

#include "rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bf16_vec.h"
#include "kernel_checks.h"
#include "row_layout.h"

namespace {

constexpr int64_t kGrainElements = 1 << 16;  // elements per parallel task: a decode's few rows stay on one thread

// squares = x * x, as `x.pow(2)` computes it.
__attribute__((optimize("fp-contract=off"))) void square(const float* x, float* squares, int64_t count) {
  at::parallel_for(0, count, kGrainElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) squares[i] = x[i] * x[i];
  });
}

// out = weight * (x * (1 / sqrt(sum / n + eps))) row by row, each operation rounded on its own as in
// `mean(...)` (= sum / n), `variance + eps`, `rsqrt` and the two products.
__attribute__((optimize("fp-contract=off"))) void normalize(const float* x, const float* sums, const float* weight,
                                                             float eps, int64_t rows, int64_t n, float* out) {
  const float count = static_cast<float>(n);
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(n, 1)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float variance = sums[r] / count;
      const float inverse = 1.f / std::sqrt(variance + eps);
      const float* row = x + r * n;
      float* row_out = out + r * n;
      for (int64_t i = 0; i < n; ++i) row_out[i] = weight[i] * (row[i] * inverse);
    }
  });
}

// One bfloat16 row: the sum of squares in float32 (16 lanes, then across them), then each element times the row's
// inverse root and its weight, rounded once. PyTorch's F.rms_norm on bfloat16 ran about ten ops with an upcast and
// a downcast: 450 us for 1,000 rows of 576 on this CPU, 61 calls a step.
void normalize_bf16_row(const uint16_t* x, const uint16_t* weight, float eps, int64_t n, uint16_t* out) {
  using namespace radixlm_bf16;
  const int64_t n_vec = n / 16 * 16;
  v16f squares = {};
  for (int64_t i = 0; i < n_vec; i += 16) {
    const v16f v = load16(x + i);
    squares += v * v;
  }
  float sum = hsum(squares);
  for (int64_t i = n_vec; i < n; ++i) sum += to_float(x[i]) * to_float(x[i]);
  const float inverse = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n_vec; i += 16) store16(out + i, load16(x + i) * inverse * load16(weight + i));
  for (int64_t i = n_vec; i < n; ++i) out[i] = to_bf16(to_float(x[i]) * inverse * to_float(weight[i]));
}

at::Tensor rms_norm_bf16(const at::Tensor& input, const at::Tensor& weight, double eps, bool pad_rows) {
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16, "weight must be bfloat16 for bfloat16 x, got ",
              weight.scalar_type());
  const at::Tensor x = input.contiguous();  // no copy when it already is
  const int64_t n = x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  // With pad_rows, rows the next linear would copy apart are written apart (csrc/row_layout.h).
  int64_t stride = n;
  const at::Tensor out = radixlm::empty_rows(x, n, pad_rows, &stride);
  if (x.numel() == 0) return out;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      normalize_bf16_row(xp + r * n, wp, static_cast<float>(eps), n, op + r * stride);
    }
  });
  return out;
}

}  // namespace

at::Tensor radixlm::rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps, bool pad_rows) {
  radixlm::check_dense_cpu(input, "x");
  radixlm::check_dense_cpu(weight, "weight");
  TORCH_CHECK(input.dim() >= 1 && weight.dim() == 1 && weight.size(0) == input.size(-1) && weight.is_contiguous(),
              "weight must be contiguous [N] for x [..., N], got ", weight.sizes(), " and ", input.sizes());
  if (input.scalar_type() == at::kBFloat16) return rms_norm_bf16(input, weight, eps, pad_rows);
  radixlm::check_dense_float_cpu(input, "x");
  radixlm::check_dense_float_cpu(weight, "weight");
  const int64_t n = input.size(-1);
  if (!input.is_contiguous()) {
    // A strided sum adds in another order than a contiguous one; PyTorch's ops on the same strides match it.
    return at::rms_norm(input, {n}, weight, eps);
  }
  const at::Tensor& x = input;
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  // The squares go into `out`, which the last step overwrites (one allocation less per call).
  square(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  // `mean` is this sum divided by n (PyTorch sums in float32 and then divides): the same call, the same order.
  const at::Tensor sums = at::sum(out, {-1}, /*keepdim=*/false).contiguous();
  normalize(x.data_ptr<float>(), sums.data_ptr<float>(), weight.data_ptr<float>(), static_cast<float>(eps), rows, n,
            out.data_ptr<float>());
  return out;
}
