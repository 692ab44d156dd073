// The bfloat16 linear on AMX tiles for a few rows (amx_bf16.cpp), for its dispatcher registration and direct Python
// entry point in csrc/bindings.cpp. radixlm/model/bf16_linear.py chooses it by row count and holds its reference.
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// Whether this CPU has AMX-BF16 tiles and the OS lets this process use them (asked once, on the first call).
bool amx_bf16_available();

// y = x W^T (+ b) in bfloat16, accumulated in float32: x bfloat16 [..., K]; W bfloat16 [N, K] contiguous, the plain
// nn.Linear layout, N and K multiples of 32; bias (optional) float32 or bfloat16 [N]. Any number of rows: it reads W
// once per 32 rows, and takes more rows than about 1 MiB of x in even chunks (64-320 rows by K). With `residual`
// (bfloat16, the output's shape) the result is x W^T (+ b) + residual, rounded to bfloat16 once: a decoder layer's
// residual add in the linear's own writes. Needs amx_bf16_available().
at::Tensor amx_bf16_linear(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                           const c10::optional<at::Tensor>& residual = c10::nullopt);

// A gated MLP's silu(x G^T) * (x U^T) in one pass, for W [N, K] whose 32-row groups interleave the two: rows
// 32g..32g+15 are G's rows 16g..16g+15, rows 32g+16..32g+31 U's same rows (`FusedGatedMLP.interleave_halves`
// in radixlm/model/fused_ops.py). The result [..., N / 2] is rounded to bfloat16 once, from the float32 sums.
at::Tensor amx_bf16_gated_linear(const at::Tensor& input, const at::Tensor& weight);

}  // namespace radixlm
