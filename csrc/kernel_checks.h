// Argument checks and helpers shared by the C++ kernels that radixlm._C's direct entry points reach
// (csrc/bindings.cpp). Those entry points skip the dispatcher's device dispatch, so every kernel checks itself
// that it is given dense CPU tensors: a tensor on another device, or a fake one, must be an error, never a read.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>

namespace radixlm {

inline void check_dense_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage(), name,
              " must be a dense CPU tensor, got one on ", t.device());
}

inline void check_dense_float_cpu(const at::Tensor& t, const char* name) {
  check_dense_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
}

// Weight bytes per parallel task of the small-batch linears: a thread is woken only for a few microseconds of
// reading at least, so small layers run on the calling thread (on a busy machine a woken worker can be descheduled
// for milliseconds). 256 KiB, not 512: the default model's int8 o_proj (332 KB) then takes both threads, 0.47 -> 0.37
// ms a step at batch 1 (one engine, the two grains alternated step by step).
constexpr int64_t kGrainBytes = 256 << 10;

inline int64_t grain_rows(int64_t row_bytes) {
  return std::max<int64_t>(16, kGrainBytes / std::max<int64_t>(1, row_bytes));
}

// The number of rows of x `[..., K]` for a small-batch linear with `weight` [N, weight_k] of `weight_type`, after
// checking the arguments.
inline int64_t check_rows(const at::Tensor& x, const at::Tensor& weight, int64_t weight_k,
                          const c10::optional<at::Tensor>& bias, at::ScalarType weight_type, int64_t max_rows) {
  check_dense_cpu(x, "x");
  check_dense_cpu(weight, "weight");
  TORCH_CHECK(x.dim() >= 1, "x must have a feature dimension");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == weight_type && weight.is_contiguous(),
              "weight must be contiguous [N, K] of ", weight_type);
  const int64_t k_dim = x.size(-1);
  TORCH_CHECK(weight_k == k_dim, "x has ", k_dim, " features, weight ", weight_k);
  const int64_t m_dim = k_dim == 0 ? 0 : x.numel() / k_dim;
  TORCH_CHECK(m_dim <= max_rows, "small-batch linear takes 0 to ", max_rows, " rows, got ", m_dim);
  if (bias.has_value()) {
    check_dense_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->scalar_type() == at::kFloat &&
                    bias->is_contiguous(),
                "bias must be contiguous float32 [N]");
  }
  return m_dim;
}

// The output `[..., N]` of a linear for x `[..., K]`.
inline at::Tensor empty_output(const at::Tensor& x, int64_t n_dim) {
  c10::SmallVector<int64_t, 4> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = n_dim;
  return at::empty(sizes, x.options());
}

}  // namespace radixlm
