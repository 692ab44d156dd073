// Rotary embedding of rotary.cpp, for its dispatcher registration and the direct entry point in csrc/bindings.cpp.
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// query_key * cos + rotate_half(query_key) * sin for float32 CPU query_key [B, H, T, D] (D contiguous) and cos, sin
// [B, T, D] (or [1, T, D], broadcast), bit for bit as transformers computes it; the result is [B, H, T, D], a view
// of a [B, T, H, D] tensor. bfloat16 query_key, cos and sin: the same formula in float32, rounded once.
at::Tensor rotary(const at::Tensor& query_key, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace radixlm
