// The GGUF linear's activation quantization (gguf_activations.h): the scalar quantize_block, which the AVX2 and
// AVX-512 versions (gguf_quantize_simd.cpp) match bit for bit, and the rows' loop over K-blocks.

#include "gguf_activations.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "linear_gguf.h"

namespace radixlm_gguf {
namespace {

// One K-block of 32 values, as gguf_tiles.quantize_activations: steps of |max| / 127, round half to even.
void quantize_block(const float* x, int8_t* q, float* step, int32_t* offset32, float* sum32, int32_t* offset16) {
  float top = 0.f;
  bool finite = true;
  for (int i = 0; i < kBlock; ++i) {
    finite = finite && std::isfinite(x[i]);
    top = std::max(top, std::fabs(x[i]));
  }
  const float inverse = 127.f / top;
  const bool usable = finite && top > 0.f && std::isfinite(inverse);
  int32_t halves[2] = {0, 0};
  for (int i = 0; i < kBlock; ++i) {
    const int32_t v = usable ? static_cast<int32_t>(std::nearbyint(x[i] * inverse)) : 0;
    q[i] = static_cast<int8_t>(v);
    halves[i / 16] += v;
  }
  *step = !finite ? std::numeric_limits<float>::quiet_NaN() : usable ? top / 127.f : 0.f;
  const int32_t sum = halves[0] + halves[1];
  *offset32 = -128 * sum;
  *sum32 = *step * static_cast<float>(sum);
  offset16[0] = -32 * halves[0];
  offset16[1] = -32 * halves[1];
}

template <typename T>
QuantizedRows quantize(const T* x, int64_t m_dim, int64_t k_dim, int64_t resolved_path) {
  const int64_t blocks = m_dim * (k_dim / kBlock);
  // Floats and ints first (4-byte aligned at the allocation's alignment), the int8 values last.
  const int64_t words = 3 * blocks + 2 * blocks;  // step, sum32, offset32; offset16
  at::Tensor buffer = at::empty({words * 4 + m_dim * k_dim}, at::TensorOptions().dtype(at::kByte));
  float* floats = reinterpret_cast<float*>(buffer.data_ptr<uint8_t>());
  float *step = floats, *sum32 = floats + blocks;
  int32_t* offset32 = reinterpret_cast<int32_t*>(floats + 2 * blocks);
  int32_t* offset16 = reinterpret_cast<int32_t*>(floats + 3 * blocks);
  int8_t* q = reinterpret_cast<int8_t*>(floats + words);
  const auto quantize_one = resolved_path == radixlm::kGgufPathAvx512 ? quantize_block_avx512
                            : resolved_path == radixlm::kGgufPathAvx2 ? quantize_block_avx2
                                                                      : quantize_block;
  at::parallel_for(0, blocks, 4096, [&](int64_t first, int64_t last) {
    float widened[kBlock];
    for (int64_t i = first; i < last; ++i) {
      const float* values = widened;
      if constexpr (std::is_same_v<T, float>) {
        values = x + i * kBlock;
      } else {
        for (int64_t j = 0; j < kBlock; ++j) widened[j] = static_cast<float>(x[i * kBlock + j]);
      }
      quantize_one(values, q + i * kBlock, step + i, offset32 + i, sum32 + i, offset16 + 2 * i);
    }
  });
  return {buffer, {q, step, offset32, sum32, offset16, k_dim, k_dim / kBlock}};
}

}  // namespace

QuantizedRows quantize_rows(const float* x, int64_t m_dim, int64_t k_dim, int64_t resolved_path) {
  return quantize(x, m_dim, k_dim, resolved_path);
}

QuantizedRows quantize_rows(const at::BFloat16* x, int64_t m_dim, int64_t k_dim, int64_t resolved_path) {
  return quantize(x, m_dim, k_dim, resolved_path);
}

}  // namespace radixlm_gguf
