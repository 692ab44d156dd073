// Rotary position embedding for the fused attention of radixlm.model.fused_ops: `q * cos + rotate_half(q) * sin`,
// transformers' formula, for the queries and keys of a layer in one call.
//
// In PyTorch ops that is a roll (or a slice, a negation and a concatenation), two products and a sum, each a
// separate allocation and pass, about 9 us a layer at one token on this CPU. Here each output element is the same
// two products and one sum, each rounded on its own (no fused multiply-add), so the result is bit-identical. For
// bfloat16 rows (and angles) the same formula runs in float32 and is rounded once: PyTorch's bfloat16 ops round each
// product and the sum, so the two can differ by a bfloat16 step.

#include "rotary.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "bf16_vec.h"
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

// The bfloat16 row: the same formula in float32, 16 lanes at a time where half of D allows it.
void rotate_row(const uint16_t* q, const uint16_t* cos, const uint16_t* sin, int64_t d, uint16_t* out) {
  using namespace radixlm_bf16;
  const int64_t half = d / 2;
  int64_t i = 0;
  for (; i + 16 <= half; i += 16) {
    const v16f low = load16(q + i), high = load16(q + i + half);
    store16(out + i, low * load16(cos + i) - high * load16(sin + i));
    store16(out + i + half, high * load16(cos + i + half) + low * load16(sin + i + half));
  }
  for (; i < half; ++i) {
    const float low = to_float(q[i]), high = to_float(q[i + half]);
    out[i] = to_bf16(low * to_float(cos[i]) - high * to_float(sin[i]));
    out[i + half] = to_bf16(high * to_float(cos[i + half]) + low * to_float(sin[i + half]));
  }
}

template <typename scalar_t, typename element_t>
const element_t* elements(const at::Tensor& t) {
  return reinterpret_cast<const element_t*>(t.data_ptr<scalar_t>());
}

}  // namespace

at::Tensor radixlm::rotary(const at::Tensor& query_key, const at::Tensor& cos, const at::Tensor& sin) {
  radixlm::check_dense_cpu(query_key, "query_key");
  radixlm::check_dense_cpu(cos, "cos");
  radixlm::check_dense_cpu(sin, "sin");
  const bool bf16 = query_key.scalar_type() == at::kBFloat16;
  if (bf16) {
    TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16,
                "cos and sin must be bfloat16 for bfloat16 query_key");
  } else {
    radixlm::check_dense_float_cpu(query_key, "query_key");
    radixlm::check_dense_float_cpu(cos, "cos");
    radixlm::check_dense_float_cpu(sin, "sin");
  }
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
  const int64_t sb = query_key.stride(0), sh = query_key.stride(1), st = query_key.stride(2);
  auto rotate_all = [&](const auto* q, const auto* cp, const auto* sp, auto* op) {
    at::parallel_for(0, batch * tokens * heads, kGrainRows, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / (tokens * heads), t = row / heads % tokens, h = row % heads;
        const int64_t angle = ((shared_angles ? 0 : b) * tokens + t) * d;
        rotate_row(q + b * sb + h * sh + t * st, cp + angle, sp + angle, d, op + row * d);
      }
    });
  };
  if (bf16) {
    rotate_all(elements<at::BFloat16, uint16_t>(query_key), elements<at::BFloat16, uint16_t>(c),
               elements<at::BFloat16, uint16_t>(s), reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
  } else {
    rotate_all(query_key.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), out.data_ptr<float>());
  }
  return out.permute({0, 2, 1, 3});
}
