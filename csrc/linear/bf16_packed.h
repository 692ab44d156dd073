// The bfloat16 linear on AVX-512 BF16 dot products over a packed weight (bf16_packed.cpp), for its dispatcher
// registration and direct Python entry point in csrc/bindings.cpp. radixlm/model/bf16_linear.py packs the weight
// and chooses the kernel.
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// y = x W^T (+ b) in bfloat16, accumulated in float32, for any number of rows: x bfloat16 [..., K] (K even);
// `packed` the weight W [N, K] regrouped as int32 [ceil(N / 32), K / 2, 32] (block b, pair p, feature j holds
// W[32b + j, 2p] in its low half and W[32b + j, 2p + 1] in its high half; zeros past N); bias (optional) [N], any
// float dtype. Needs a CPU with AVX-512 BF16.
at::Tensor bf16_packed_linear(const at::Tensor& input, const at::Tensor& packed, int64_t out_features,
                              const c10::optional<at::Tensor>& bias);

}  // namespace radixlm
