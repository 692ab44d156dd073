// The GGUF linear's activations: rows quantized to int8 per K-block of 32 values (radixlm/model/gguf_tiles.py's
// quantize_activations is the reference), in one buffer, and views of a block of rows and a slice of their K.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "gguf_kernels.h"

namespace radixlm_gguf {

// The quantized activations, all in one buffer (one allocation a call: a decode step makes a hundred calls).
struct QuantizedRows {
  at::Tensor buffer;
  Activations view;
};

// x's m_dim rows of k_dim values (a multiple of 32) quantized per K-block with the instructions of `resolved_path`
// (radixlm::kGgufPath*, the same results on each); bfloat16 rows are widened (exactly) a block at a time, so both
// dtypes quantize the same values alike.
QuantizedRows quantize_rows(const float* x, int64_t m_dim, int64_t k_dim, int64_t resolved_path);
QuantizedRows quantize_rows(const at::BFloat16* x, int64_t m_dim, int64_t k_dim, int64_t resolved_path);

// Rows from `first_row` on, K-blocks [first_block, first_block + num_blocks) of each, as a view whose row 0 and
// block 0 are those.
inline Activations slice(const Activations& a, int64_t first_row, int64_t first_block, int64_t num_blocks) {
  const int64_t start = first_row * a.row_blocks + first_block;
  return {a.q + start * kBlock, a.step + start, a.offset32 + start, a.sum32 + start,
          a.offset16 + 2 * start, num_blocks * kBlock, a.row_blocks};
}

}  // namespace radixlm_gguf
