// Rotary position embedding for the fused attention of radixlm.model.fused_ops: `q * cos + rotate_half(q) * sin`,
// transformers' formula, for the queries and keys of a layer in one call.
//
// In PyTorch ops that is a roll (or a slice, a negation and a concatenation), two products and a sum, each a
// separate allocation and pass, about 9 us a layer at one token on this CPU. Here each output element is the same
// two products and one sum, each rounded on its own (no fused multiply-add), so the result is bit-identical.

#include "rotary.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "kernel_checks.h"

namespace {

constexpr int64_t kGrainRows = 256;  // (token, head) rows per parallel task: a decode's few rows stay on one thread

// One (token, head) row: out[i] = q[i] * cos[i] + r[i] * sin[i] with r = (-q[half:], q[:half]).
__attribute__((optimize("fp-contract=off"))) void rotate_row(const float* q, const float* cos, const float* sin,
                                                              int64_t d, float* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = q[i] * cos[i] + -(q[i + half] * sin[i]);
  for (int64_t i = half; i < d; ++i) out[i] = q[i] * cos[i] + q[i - half] * sin[i];
}

}  // namespace

at::Tensor radixlm::rotary(const at::Tensor& query_key, const at::Tensor& cos, const at::Tensor& sin) {
  radixlm::check_dense_float_cpu(query_key, "query_key");
  radixlm::check_dense_float_cpu(cos, "cos");
  radixlm::check_dense_float_cpu(sin, "sin");
  TORCH_CHECK(query_key.dim() == 4 && query_key.stride(3) == 1, "query_key must be [B, H, T, D] with D contiguous");
  const int64_t batch = query_key.size(0), heads = query_key.size(1), tokens = query_key.size(2),
                d = query_key.size(3);
  TORCH_CHECK(d % 2 == 0, "head_dim must be even, got ", d);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 3 && (cos.size(0) == batch || cos.size(0) == 1) &&
                  cos.size(1) == tokens && cos.size(2) == d,
              "cos and sin must be [B, T, D] (or [1, T, D]) for query_key [B, H, T, D]");
  const bool shared_angles = cos.size(0) == 1;  // one set of positions for every sequence, broadcast
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();  // no copy when they already are
  // [B, T, H, D]: the layout of the q/k/v projection's output, which the attention reads as views.
  at::Tensor out = at::empty({batch, tokens, heads, d}, query_key.options());
  const float* q = query_key.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t sb = query_key.stride(0), sh = query_key.stride(1), st = query_key.stride(2);
  at::parallel_for(0, batch * tokens * heads, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (tokens * heads), t = row / heads % tokens, h = row % heads;
      const int64_t angle = ((shared_angles ? 0 : b) * tokens + t) * d;
      rotate_row(q + b * sb + h * sh + t * st, cp + angle, sp + angle, d, op + row * d);
    }
  });
  return out.permute({0, 2, 1, 3});
}
