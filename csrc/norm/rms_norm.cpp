// RMSNorm for the fused decoder layers (radixlm.model.fused_ops.FusedRMSNorm): the numbers of transformers' float32
// RMSNorm, `weight * (x * rsqrt(mean(x * x) + eps))`, bit for bit, in one call.
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

#include "kernel_checks.h"

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

}  // namespace

at::Tensor radixlm::rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  radixlm::check_dense_float_cpu(input, "x");
  radixlm::check_dense_float_cpu(weight, "weight");
  TORCH_CHECK(input.dim() >= 1 && weight.dim() == 1 && weight.size(0) == input.size(-1) && weight.is_contiguous(),
              "weight must be contiguous [N] for x [..., N], got ", weight.sizes(), " and ", input.sizes());
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
