// The GGUF linear of linear_gguf.cpp, for its dispatcher registration and the direct entry points in
// csrc/bindings.cpp.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace radixlm {

// Path ids of gguf_linear: the best this CPU runs, the portable kernels, AVX2, AVX-512 VNNI; and AMX, which "best"
// never picks: bfloat16 x times the weight dequantized to bfloat16 on AMX tiles (gguf_amx.h), for many rows.
constexpr int64_t kGgufPathBest = 0, kGgufPathPortable = 1, kGgufPathAvx2 = 2, kGgufPathAvx512 = 3, kGgufPathAmx = 4;

// y = x W^T (+ b) for float32 or bfloat16 x [..., K] (any number of rows; y in x's dtype, bfloat16 rounded from the
// float32 sums) and W [N, K] given as parts stacked along the output
// features, part i being tiles[i] (radixlm.model.gguf_tiles.pack_tiles of ggml type types[i] with out_features[i]
// rows). x is quantized to int8 per 32 values first (gguf_tiles.quantize_activations), so y equals
// F.linear(quantize_activations(x), dequantize(W), b) up to the order of float additions; a row's result does not
// depend on the other rows. `path` forces a path (the tests'); an unknown one, or one the CPU cannot run, is an error.
// The AMX path instead takes bfloat16 x as it is, times the weight dequantized to bfloat16: y equals
// F.linear(x, dequantize(W).bfloat16(), b) up to the order of float additions.
at::Tensor gguf_linear(const at::Tensor& input, at::TensorList tiles, at::IntArrayRef types,
                       at::IntArrayRef out_features, const c10::optional<at::Tensor>& bias, int64_t path);

// Rows `ids` of a tiled weight (tiles of ggml type `type`, [out_features, in_features]), dequantized: float32
// [ids.numel(), in_features], equal to gguf_blocks.dequantize of those rows. An id outside [0, out_features) is an
// error.
at::Tensor gguf_rows(const at::Tensor& tiles, int64_t type, int64_t in_features, int64_t out_features,
                     const at::Tensor& ids);

// Writes the tiles of a GGUF weight (ggml type `type`, rows of `in_features` weights) into `out`, contiguous uint8
// [ceil(N / 16), tile bytes], from its rows of blocks as the file stores them, contiguous uint8 [N, row bytes]: the
// bytes radixlm.model.gguf_tiles.pack_tiles returns.
void gguf_pack_tiles(const at::Tensor& rows, int64_t type, int64_t in_features, at::Tensor& out);

// The int8 paths this CPU runs, best last (the AMX path, a different product, is there where amx_bf16_available()).
std::vector<int64_t> gguf_linear_paths();

}  // namespace radixlm
