// The small-batch linear kernels of linear.cpp and linear_int8.cpp, for their dispatcher registrations and the direct
// Python entry points of python_module.cpp.
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// y = x W^T (+ b): x float32 [..., K] with at most 9 rows, W float32 [N, K] contiguous.
at::Tensor small_batch_linear(const at::Tensor& input, const at::Tensor& weight,
                              const c10::optional<at::Tensor>& bias);

// radixlm.model.quantize.Int8Linear's output for x float32 [..., K] with at most 64 rows, from its int8 weights
// packed by radixlm.model.small_batch.Int8Rows.
at::Tensor small_batch_int8_linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& weight_scales,
                                   const at::Tensor& weight_sums, const c10::optional<at::Tensor>& bias);

}  // namespace radixlm
