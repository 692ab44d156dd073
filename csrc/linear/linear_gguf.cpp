// The GGUF linear: y = x W^T (+ b) with W kept in a GGUF file's own 4-, 6- or 8-bit blocks (Q4_0, Q4_1, Q8_0, Q4_K,
// Q6_K), regrouped into tiles of 16 output rows (radixlm/model/gguf_tiles.py), and x quantized to int8 per 32 values.
//
// One kernel serves every row count: decode (a few rows, bound by reading the weights: 0.56 to 1.06 bytes a weight)
// and prefill chunks (many rows, bound by the multiply-adds, 4 a 32-bit lane with VNNI). Each output element is one
// thread's sum over K in a fixed order, so a row's result does not depend on the rows beside it or on the threads.
// Threads take ranges of tiles; within a range, rows go by blocks of kRowBlock (their int8 activations stay in L2
// while each tile of the range passes over them), each tile by chunks of kChunkRows rows (a chunk's accumulators and
// the K-block's unpacked weights fill the registers).
//
// The instruction set is chosen at run time (isa.h's cpu_has_avx512, cpu_has_avx2), not by the build's -march, so one
// build serves every x86 CPU and a test can run each path on one machine.

#include "linear_gguf.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>

#include "amx_bf16.h"
#include "gguf_activations.h"
#include "gguf_amx.h"
#include "gguf_kernels.h"
#include "isa.h"
#include "kernel_checks.h"

namespace {

using radixlm_gguf::kBlock;
using radixlm_gguf::kChunkRows;
using radixlm_gguf::kTileRows;
using radixlm_gguf::QuantizedRows;
using radixlm_gguf::quantize_rows;
using radixlm_gguf::slice;

constexpr int64_t kRowBlock = 128;
// K per slice: a tile's slice (17 KB of Q8_0, 9 KB of Q4_K) stays in L1 while every chunk of a row block passes over
// it. A multiple of every format's super-block (256), so slices start on super-block boundaries.
constexpr int64_t kSliceK = 1024;
constexpr int64_t kMaxParts = 8;  // a fused projection's parts of different formats (q/k/v: 3)

const radixlm_gguf::TileFormat& find_format(int64_t ggml_type) {
  const radixlm_gguf::TileFormat* format = radixlm_gguf::find_tile_format(ggml_type);
  TORCH_CHECK(format != nullptr, "gguf_linear: ggml type ", ggml_type,
              " is not supported (Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14)");
  return *format;
}

// `path` checked against the CPU, and 0 (best) resolved to the best path it runs.
int64_t resolve_path(int64_t path) {
  TORCH_CHECK(path >= radixlm::kGgufPathBest && path <= radixlm::kGgufPathAmx,
              "gguf_linear: path must be 0 (best), 1 (portable), 2 (AVX2), 3 (AVX-512 VNNI) or 4 (AMX), got ", path);
  TORCH_CHECK(path != radixlm::kGgufPathAmx || radixlm::amx_bf16_available(),
              "gguf_linear: this CPU cannot run the AMX path");
  if (path == radixlm::kGgufPathAmx) return path;
  const bool avx512 = radixlm::isa::cpu_has_avx512(), avx2 = radixlm::isa::cpu_has_avx2();
  TORCH_CHECK(path != radixlm::kGgufPathAvx512 || avx512, "gguf_linear: this CPU cannot run the AVX-512 VNNI path");
  TORCH_CHECK(path != radixlm::kGgufPathAvx2 || avx2, "gguf_linear: this CPU cannot run the AVX2 path");
  if (path != radixlm::kGgufPathBest) return path;
  return avx512 ? radixlm::kGgufPathAvx512 : avx2 ? radixlm::kGgufPathAvx2 : radixlm::kGgufPathPortable;
}

radixlm_gguf::TileKernel select_kernel(int64_t ggml_type, int64_t resolved_path) {
  if (resolved_path == radixlm::kGgufPathAvx512) return radixlm_gguf::avx512_kernel(ggml_type);
  if (resolved_path == radixlm::kGgufPathAvx2) return radixlm_gguf::avx2_kernel(ggml_type);
  return radixlm_gguf::portable_kernel(ggml_type);
}

struct Part {
  const uint8_t* tiles;
  int64_t type, tile_bytes, out_features, first_tile, first_column, super_weights, super_bytes;
  radixlm_gguf::TileKernel kernel;
};

int64_t num_part_tiles(const Part& part) { return (part.out_features + kTileRows - 1) / kTileRows; }

// The parts, checked against x's k_dim, with their kernels for the path; n_dim gets their output features in all.
c10::SmallVector<Part, kMaxParts> collect_parts(at::TensorList tiles, at::IntArrayRef types,
                                                at::IntArrayRef out_features, int64_t k_dim, int64_t resolved_path,
                                                int64_t& n_dim) {
  TORCH_CHECK(!tiles.empty() && static_cast<int64_t>(tiles.size()) <= kMaxParts, "gguf_linear takes 1 to ",
              kMaxParts, " parts, got ", tiles.size());
  TORCH_CHECK(types.size() == tiles.size() && out_features.size() == tiles.size(),
              "gguf_linear: tiles, types and out_features must have one entry per part");
  c10::SmallVector<Part, kMaxParts> parts;
  int64_t num_tiles = 0;
  n_dim = 0;
  for (size_t i = 0; i < tiles.size(); ++i) {
    const radixlm_gguf::TileFormat& format = find_format(types[i]);
    TORCH_CHECK(k_dim > 0 && k_dim % format.super_weights == 0, "gguf_linear: ", format.name,
                " needs x's features to be a positive multiple of ", format.super_weights, ", got ", k_dim);
    TORCH_CHECK(out_features[i] > 0, "gguf_linear: out_features must be positive, got ", out_features[i]);
    const int64_t part_tiles = (out_features[i] + kTileRows - 1) / kTileRows;
    const int64_t tile_bytes = k_dim / format.super_weights * format.super_bytes();
    radixlm::check_dense_cpu(tiles[i], "tiles");
    TORCH_CHECK(tiles[i].scalar_type() == at::kByte && tiles[i].is_contiguous() &&
                    tiles[i].sizes() == at::IntArrayRef({part_tiles, tile_bytes}),
                "gguf_linear: part ", i, " must be contiguous uint8 [", part_tiles, ", ", tile_bytes, "] (",
                format.name,
                ", ", out_features[i], " x ", k_dim, "), got ", tiles[i].scalar_type(), " ", tiles[i].sizes());
    parts.push_back({tiles[i].data_ptr<uint8_t>(), types[i], tile_bytes, out_features[i], num_tiles, n_dim,
                     format.super_weights, format.super_bytes(), select_kernel(types[i], resolved_path)});
    n_dim += out_features[i];
    num_tiles += part_tiles;
  }
  return parts;
}

// Tile `local` of `part` times `block_rows` rows of `rows` (a row block's view), K slice by slice so that each slice
// of the tile stays in L1 while every chunk of rows passes over it. out: the tile's first column of the block's first
// row, rows ld_out apart; bias: the tile's, or null.
void multiply_tile(const Part& part, int64_t local, const radixlm_gguf::Activations& rows, int64_t block_rows,
                   float* out, int64_t ld_out, const float* bias) {
  const int64_t cols = std::min(kTileRows, part.out_features - local * kTileRows);
  const uint8_t* tile = part.tiles + local * part.tile_bytes;
  const int64_t k_dim = rows.k;
  for (int64_t k0 = 0; k0 < k_dim; k0 += kSliceK) {
    const int64_t k1 = std::min(k_dim, k0 + kSliceK);
    const radixlm_gguf::Activations rows_k = slice(rows, 0, k0 / kBlock, (k1 - k0) / kBlock);
    const uint8_t* tile_k = tile + k0 / part.super_weights * part.super_bytes;
    const float* bias_k = k1 == k_dim ? bias : nullptr;  // once, with the last slice
    for (int64_t m = 0; m < block_rows; m += kChunkRows) {
      part.kernel(tile_k, rows_k, m, std::min(kChunkRows, block_rows - m), out, ld_out, cols, bias_k, k0 > 0);
    }
  }
}

// The first tile whose bytes start at or after `offset` (of all the parts' bytes, in order).
int64_t tile_at(const c10::SmallVector<Part, kMaxParts>& parts, int64_t offset) {
  for (const Part& part : parts) {
    if (offset < num_part_tiles(part) * part.tile_bytes) {
      return part.first_tile + (offset + part.tile_bytes - 1) / part.tile_bytes;
    }
    offset -= num_part_tiles(part) * part.tile_bytes;
  }
  return parts.back().first_tile + num_part_tiles(parts.back());
}

// Where the products go: float32 rows, or bfloat16 ones (`bf16`) rounded from the float32 sums; rows ld apart.
struct Output {
  float* float32;
  at::BFloat16* bf16;
  int64_t ld;
  const float* bias;  // [ld] or null
};

// Tiles [first, last) of the parts times all m_dim rows, row block by row block.
void multiply_tiles(const c10::SmallVector<Part, kMaxParts>& parts, const radixlm_gguf::Activations& rows,
                    int64_t m_dim, int64_t first, int64_t last, const Output& out) {
  float scratch[kRowBlock * kTileRows];  // a bfloat16 output's float32 sums, rounded as they are copied out
  for (int64_t row_block = 0; row_block < m_dim; row_block += kRowBlock) {
    const int64_t block_rows = std::min(kRowBlock, m_dim - row_block);
    const radixlm_gguf::Activations block = slice(rows, row_block, 0, rows.k / kBlock);
    size_t p = 0;
    for (int64_t t = first; t < last; ++t) {
      while (t >= parts[p].first_tile + num_part_tiles(parts[p])) ++p;
      const Part& part = parts[p];
      const int64_t local = t - part.first_tile;
      const int64_t column = part.first_column + local * kTileRows;
      const float* tile_bias = out.bias ? out.bias + column : nullptr;
      if (out.bf16 == nullptr) {
        multiply_tile(part, local, block, block_rows, out.float32 + row_block * out.ld + column, out.ld, tile_bias);
        continue;
      }
      multiply_tile(part, local, block, block_rows, scratch, kTileRows, tile_bias);
      const int64_t cols = std::min(kTileRows, part.out_features - local * kTileRows);
      at::BFloat16* dst = out.bf16 + row_block * out.ld + column;
      for (int64_t r = 0; r < block_rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) dst[r * out.ld + c] = at::BFloat16(scratch[r * kTileRows + c]);
      }
    }
  }
}

}  // namespace

at::Tensor radixlm::gguf_linear(const at::Tensor& input, at::TensorList tiles, at::IntArrayRef types,
                                at::IntArrayRef out_features, const c10::optional<at::Tensor>& bias, int64_t path) {
  radixlm::check_dense_cpu(input, "x");
  TORCH_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kBFloat16,
              "x must be float32 or bfloat16, got ", input.scalar_type());
  TORCH_CHECK(input.dim() >= 1, "x must have a feature dimension");
  const int64_t k_dim = input.size(-1);
  const int64_t resolved_path = resolve_path(path);
  int64_t n_dim = 0;
  const c10::SmallVector<Part, kMaxParts> parts = collect_parts(tiles, types, out_features, k_dim, resolved_path,
                                                                n_dim);
  if (bias.has_value()) {
    radixlm::check_dense_float_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n_dim && bias->is_contiguous(),
                "bias must be contiguous float32 [", n_dim, "]");
  }
  const at::Tensor x = input.contiguous();
  const int64_t m_dim = x.numel() / k_dim;
  at::Tensor out = radixlm::empty_output(x, n_dim);
  TORCH_CHECK(resolved_path != radixlm::kGgufPathAmx || x.scalar_type() == at::kBFloat16,
              "gguf_linear: the AMX path takes bfloat16 x, got ", x.scalar_type());
  if (m_dim == 0) return out;
  if (resolved_path == radixlm::kGgufPathAmx) {
    c10::SmallVector<radixlm_gguf::AmxPart, kMaxParts> amx_parts;
    for (const Part& part : parts) {
      amx_parts.push_back({part.tiles, part.type, part.tile_bytes, part.out_features, part.first_column});
    }
    radixlm_gguf::amx_linear(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), m_dim, k_dim,
                             amx_parts.data(), static_cast<int64_t>(amx_parts.size()),
                             bias.has_value() ? bias->data_ptr<float>() : nullptr,
                             reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), n_dim);
    return out;
  }
  const bool bf16_out = x.scalar_type() == at::kBFloat16;
  const QuantizedRows rows = bf16_out ? quantize_rows(x.data_ptr<at::BFloat16>(), m_dim, k_dim, resolved_path)
                                      : quantize_rows(x.data_ptr<float>(), m_dim, k_dim, resolved_path);
  // One task a thread, each an equal share of the weight bytes (parts of different formats have tiles of different
  // sizes, and at one row the bytes are the time), each reading at least kGrainBytes per row it serves: a small
  // layer stays on one thread.
  int64_t total_bytes = 0;
  for (const Part& part : parts) total_bytes += num_part_tiles(part) * part.tile_bytes;
  const int64_t work = total_bytes * std::min(m_dim, kRowBlock);
  const int64_t num_tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), work / radixlm::kGrainBytes));
  const Output output{bf16_out ? nullptr : out.data_ptr<float>(), bf16_out ? out.data_ptr<at::BFloat16>() : nullptr,
                      n_dim, bias.has_value() ? bias->data_ptr<float>() : nullptr};
  at::parallel_for(0, num_tasks, 1, [&](int64_t first_task, int64_t last_task) {
    multiply_tiles(parts, rows.view, m_dim, tile_at(parts, total_bytes * first_task / num_tasks),
                   tile_at(parts, total_bytes * last_task / num_tasks), output);
  });
  return out;
}

at::Tensor radixlm::gguf_rows(const at::Tensor& tiles, int64_t type, int64_t in_features, int64_t out_features,
                              const at::Tensor& ids) {
  const radixlm_gguf::TileFormat& format = find_format(type);
  TORCH_CHECK(in_features > 0 && in_features % format.super_weights == 0, "gguf_rows: ", format.name,
              " rows hold a positive multiple of ", format.super_weights, " weights, got ", in_features);
  TORCH_CHECK(out_features > 0, "gguf_rows: out_features must be positive, got ", out_features);
  const int64_t tile_bytes = in_features / format.super_weights * format.super_bytes();
  radixlm::check_dense_cpu(tiles, "tiles");
  TORCH_CHECK(tiles.scalar_type() == at::kByte && tiles.is_contiguous() &&
                  tiles.sizes() == at::IntArrayRef({(out_features + kTileRows - 1) / kTileRows, tile_bytes}),
              "gguf_rows: tiles must be contiguous uint8 [", (out_features + kTileRows - 1) / kTileRows, ", ",
              tile_bytes, "], got ", tiles.scalar_type(), " ", tiles.sizes());
  radixlm::check_dense_cpu(ids, "ids");
  TORCH_CHECK(ids.scalar_type() == at::kLong, "gguf_rows: ids must be int64, got ", ids.scalar_type());
  const at::Tensor flat = ids.contiguous().reshape({-1});
  const int64_t* id = flat.data_ptr<int64_t>();
  const int64_t count = flat.numel();
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < out_features, "gguf_rows: id ", id[i], " is outside [0, ", out_features, ")");
  }
  at::Tensor out = at::empty({count, in_features}, at::TensorOptions().dtype(at::kFloat));
  float* data = out.data_ptr<float>();
  const uint8_t* base = tiles.data_ptr<uint8_t>();
  at::parallel_for(0, count, 16, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      radixlm_gguf::dequantize_tile_row(type, base + id[i] / kTileRows * tile_bytes, in_features, id[i] % kTileRows,
                                        data + i * in_features);
    }
  });
  return out;
}

std::vector<int64_t> radixlm::gguf_linear_paths() {
  std::vector<int64_t> paths{kGgufPathPortable};
  if (isa::cpu_has_avx2()) paths.push_back(kGgufPathAvx2);
  if (isa::cpu_has_avx512()) paths.push_back(kGgufPathAvx512);
  return paths;
}
