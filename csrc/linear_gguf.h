// The GGUF linear of csrc/linear_gguf.cpp, for its dispatcher registration and the direct entry points of
// python_module.cpp.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace radixlm {

// Path ids of gguf_linear: the best this CPU runs, the portable kernels, the AVX2 + FMA + F16C ones.
constexpr int64_t kGgufPathBest = 0, kGgufPathPortable = 1, kGgufPathAvx2 = 2;

// y = x W^T (+ b) for float32 x [..., K] of at most radixlm.model.gguf_blocks.GGUF_MAX_ROWS rows and W [N, K] given
// as its GGUF blocks, uint8 [N, K / block weights * block bytes] of ggml type `ggml_type` (Q4_0, Q4_1, Q8_0, Q4_K,
// Q6_K): equal to F.linear(x, gguf_blocks.dequantize(W), b) up to the order of float additions. `path` forces a path
// (the tests'); an unknown one, or one the CPU cannot run, is an error.
at::Tensor gguf_linear(const at::Tensor& input, const at::Tensor& blocks, int64_t ggml_type,
                       const c10::optional<at::Tensor>& bias, int64_t path);

// The paths this CPU runs, best last.
std::vector<int64_t> gguf_linear_paths();

}  // namespace radixlm
