// The bfloat16 linear on AVX-512 BF16 dot products for a few rows (bf16_dot.cpp), for its dispatcher registration and
// direct Python entry point in csrc/bindings.cpp. radixlm/model/bf16_linear.py chooses it by CPU and row count and
// holds its reference.
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// Whether this CPU has AVX-512 BF16 (asked once).
bool bf16_dot_available();

// y = x W^T (+ b) in bfloat16, accumulated in float32: x bfloat16 [..., K]; W bfloat16 [N, K] contiguous, the plain
// nn.Linear layout, K a multiple of 32; bias (optional) [N], any float dtype. Any number of rows; meant for up to a
// few dozen (it reads each group of weight rows from memory once, and x's rows once per group). Needs
// bf16_dot_available().
at::Tensor bf16_dot_linear(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias);

}  // namespace radixlm
