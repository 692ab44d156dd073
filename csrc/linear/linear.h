// The small-batch linear kernels of linear.cpp and linear_int8.cpp, for their dispatcher registrations and the direct
// Python entry points in csrc/bindings.cpp.
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

// Int8Linear's scaling around fbgemm above the int8 kernel's rows (int8_scaling.cpp): x [M, K] -> [M + 1, K], each
// row divided by its absolute maximum (written to row_max, M elements), then the range row (+1, 0, ..., 0, -1).
at::Tensor int8_normalize_rows(const at::Tensor& input, at::Tensor& row_max);

// fbgemm's output [M + 1, N] for those rows, in place: each of its first M rows times its row_max, plus the bias.
void int8_rescale_rows_(at::Tensor& out, const at::Tensor& row_max, const c10::optional<at::Tensor>& bias);

}  // namespace radixlm
