// RMSNorm of rms_norm.cpp, for its dispatcher registration and the direct entry point in csrc/bindings.cpp.
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// weight * (x * rsqrt(mean(x * x, -1) + eps)) for float32 CPU x [..., N] and weight [N], bit for bit as transformers'
// float32 RMSNorm computes it; for bfloat16 x and weight, in float32 and rounded once (F.rms_norm's numbers, to
// float32 rounding), a contiguous bfloat16 result.
// pad_rows: bfloat16 rows as silu_and_mul's pad_rows writes them (csrc/row_layout.h); float32 rows ignore it.
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps, bool pad_rows = false);

}  // namespace radixlm
