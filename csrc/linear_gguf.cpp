// The GGUF linear: y = x W^T (+ b) for a few float32 rows x [..., K] (decode, a decode verifying drafts) with W
// [N, K] kept in GGUF's packed blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K; gguf_kernels.h), never dequantized whole.
//
// At one row the product reads every weight once, so its cost is the bytes of W: 0.56 (Q4_0) to 1.06 (Q8_0) bytes
// a weight instead of 4 for float32. Each thread takes a range of output rows by tiles of kTileRows; for each span of
// the tile it unpacks the blocks into floats in an L1 buffer once (scale * q (+ min), the reference's values) and
// multiplies them with every activation row, so the unpacking is paid once whatever the rows. Unpacking costs about
// a cycle per 4 weights, which at one row keeps two Zen 2 cores near their memory bandwidth; with more rows the
// multiply-adds dominate, and above GGUF_MAX_ROWS dequantizing once and calling F.linear is faster.
//
// The instruction set is chosen at run time (cpu_has_avx2), not by the build's -march, so the same build serves
// CPUs with and without AVX2 and a test can run both paths on one machine.

#include "linear_gguf.h"

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>

#include "gguf_kernels.h"
#include "kernel_checks.h"

namespace {

using radixlm_gguf::kSpan;
using radixlm_gguf::kTileRows;

// radixlm.model.gguf_blocks.GGUF_MAX_ROWS (see there and the header comment).
constexpr int64_t kMaxGgufRows = 128;

struct Problem {
  const float* x;  // [M, K]
  int64_t m_dim, k_dim;
  const uint8_t* weight;  // [N, row_bytes]
  int64_t row_bytes;
  const float* bias;  // [N] or null
  const float* xsum;  // [M, K / 32] sums of x for the fused kernel, or null: the buffered one
  float* out;         // [M, N]
  int64_t n_dim;
  radixlm_gguf::Format format;
  radixlm_gguf::Kernels kernels;
};

// out[:, n .. n + rows) from weight rows n .. n + rows (rows <= kTileRows), through the L1 buffer.
void buffered_tile(const Problem& p, int64_t n, int64_t rows, float* buffer, float* partial) {
  std::fill(partial, partial + p.m_dim * kTileRows, 0.f);
  const uint8_t* tile = p.weight + n * p.row_bytes;
  for (int64_t k = 0; k < p.k_dim; k += kSpan) {
    const int64_t len = std::min(kSpan, p.k_dim - k), blocks = len / p.format.weights;
    const uint8_t* src = tile + k / p.format.weights * p.format.bytes;
    for (int64_t t = 0; t < rows; ++t) p.kernels.decode(src + t * p.row_bytes, blocks, buffer + t * kSpan);
    p.kernels.dot(p.x + k, p.k_dim, p.m_dim, buffer, rows, len, partial);
  }
  for (int64_t m = 0; m < p.m_dim; ++m) {
    for (int64_t t = 0; t < rows; ++t) p.out[m * p.n_dim + n + t] = partial[m * kTileRows + t];
  }
}

// out[:, begin .. end) (+ bias): row by row through the fused kernel for a few rows (the weights then stream in
// order), else by tiles through the buffer.
void gguf_range(const Problem& p, int64_t begin, int64_t end) {
  if (p.xsum != nullptr) {
    const int64_t blocks = p.k_dim / p.format.weights;
    for (int64_t n = begin; n < end; ++n) {
      p.kernels.fused(p.weight + n * p.row_bytes, blocks, p.x, p.k_dim, p.xsum, p.m_dim, p.out + n, p.n_dim);
    }
  } else {
    alignas(64) float buffer[kTileRows * kSpan];
    float partial[kMaxGgufRows * kTileRows];
    for (int64_t n = begin; n < end; n += kTileRows) {
      buffered_tile(p, n, std::min(kTileRows, end - n), buffer, partial);
    }
  }
  if (p.bias == nullptr) return;
  for (int64_t m = 0; m < p.m_dim; ++m) {
    for (int64_t n = begin; n < end; ++n) p.out[m * p.n_dim + n] += p.bias[n];
  }
}

// sums[i] = x[32 i] + ... + x[32 i + 31] for the `count` floats of x (a multiple of 32).
void sum_chunks(const float* x, int64_t count, c10::SmallVectorImpl<float>& sums) {
  sums.resize(count / 32);
  for (int64_t i = 0; i < count / 32; ++i) {
    float lanes[8] = {};  // 8 independent sums: the compiler makes them one vector (a single sum cannot reorder)
    for (int64_t j = 0; j < 32; ++j) lanes[j % 8] += x[32 * i + j];
    sums[i] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
}

const radixlm_gguf::Format& find_format(int64_t ggml_type) {
  for (const auto& format : radixlm_gguf::kFormats) {
    if (format.type == ggml_type) return format;
  }
  TORCH_CHECK(false, "gguf_linear: ggml type ", ggml_type,
              " is not supported (Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14)");
}

radixlm_gguf::Kernels select_kernels(int64_t ggml_type, int64_t path) {
  TORCH_CHECK(path >= radixlm::kGgufPathBest && path <= radixlm::kGgufPathAvx2,
              "gguf_linear: path must be 0 (best), 1 (portable) or 2 (AVX2), got ", path);
  const bool avx2 = radixlm_gguf::cpu_has_avx2();
  TORCH_CHECK(path != radixlm::kGgufPathAvx2 || avx2, "gguf_linear: this CPU cannot run the AVX2 path");
  const bool use_avx2 = path == radixlm::kGgufPathAvx2 || (path == radixlm::kGgufPathBest && avx2);
  return use_avx2 ? radixlm_gguf::avx2_kernels(ggml_type) : radixlm_gguf::portable_kernels(ggml_type);
}

}  // namespace

at::Tensor radixlm::gguf_linear(const at::Tensor& input, const at::Tensor& blocks, int64_t ggml_type,
                                const c10::optional<at::Tensor>& bias, int64_t path) {
  const radixlm_gguf::Format& format = find_format(ggml_type);
  const radixlm_gguf::Kernels kernels = select_kernels(ggml_type, path);
  radixlm::check_dense_cpu(blocks, "blocks");
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte,
              "gguf_linear: blocks must be uint8 [N, row bytes], got ", blocks.scalar_type(), " ", blocks.sizes());
  const int64_t row_bytes = blocks.size(1);
  TORCH_CHECK(row_bytes > 0 && row_bytes % format.bytes == 0, "gguf_linear: ", format.name, " rows are whole ",
              format.bytes, "-byte blocks, got ", row_bytes, " bytes");
  TORCH_CHECK(input.dim() >= 1, "x must have a feature dimension");
  TORCH_CHECK(input.size(-1) % format.weights == 0, "gguf_linear: ", format.name,
              " needs x's features to be a multiple of ", format.weights, ", got x of shape ", input.sizes());
  const int64_t weight_k = row_bytes / format.bytes * format.weights;
  const int64_t m_dim = radixlm::check_rows(input, blocks, weight_k, bias, at::kByte, kMaxGgufRows);
  const at::Tensor x = input.contiguous();  // no copy when it already is
  const int64_t n_dim = blocks.size(0), k_dim = x.size(-1);
  at::Tensor out = radixlm::empty_output(x, n_dim);
  if (m_dim == 0 || n_dim == 0) return out;
  const bool fused = kernels.fused != nullptr && m_dim <= radixlm_gguf::kFusedRows;
  c10::SmallVector<float, radixlm_gguf::kFusedRows * 256> xsum;  // on the stack up to K = 8192
  if (fused) sum_chunks(x.data_ptr<float>(), m_dim * k_dim, xsum);
  const Problem p{x.data_ptr<float>(), m_dim, k_dim, blocks.data_ptr<uint8_t>(), row_bytes,
                  bias.has_value() ? bias->data_ptr<float>() : nullptr, fused ? xsum.data() : nullptr,
                  out.data_ptr<float>(), n_dim, format, kernels};
  const int64_t num_tiles = (n_dim + kTileRows - 1) / kTileRows;
  const int64_t grain_tiles = std::max<int64_t>(1, radixlm::grain_rows(row_bytes) / kTileRows);
  at::parallel_for(0, num_tiles, grain_tiles, [&](int64_t first, int64_t last) {
    gguf_range(p, first * kTileRows, std::min(n_dim, last * kTileRows));  // ranges start on a tile
  });
  return out;
}

std::vector<int64_t> radixlm::gguf_linear_paths() {
  std::vector<int64_t> paths{kGgufPathPortable};
  if (radixlm_gguf::cpu_has_avx2()) paths.push_back(kGgufPathAvx2);
  return paths;
}

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("gguf_linear(Tensor x, Tensor blocks, int ggml_type, Tensor? bias, int path=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("gguf_linear", &radixlm::gguf_linear); }
