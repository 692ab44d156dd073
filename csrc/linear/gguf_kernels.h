// The GGUF linear's tile kernels, one set per instruction set (linear_gguf.cpp picks one at run time): portable C++
// (gguf_portable.cpp), AVX2 (gguf_avx2.cpp) and AVX-512 VNNI (gguf_avx512.cpp). The weights are in the tile layout of
// radixlm/model/gguf_tiles.py (16 output rows side by side, 4 weights a 32-bit lane), the activations quantized to
// int8 per 32 values (quantize_activations there is the reference).
#pragma once

#include <cstdint>
#include <cstring>

namespace radixlm_gguf {

// ggml type ids (gguf.GGMLQuantizationType).
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14;
constexpr int64_t kTileRows = 16;
constexpr int64_t kBlock = 32;  // weights per K-block: one activation step, 8 lanes of 4 per row

// A format's tile layout (gguf_tiles.TILE_FORMATS): super-blocks of `super_weights` weights, each `meta_bytes` of
// metadata for the 16 rows and then super_weights / 32 K-blocks of `kblock_bytes` bytes of quants.
struct TileFormat {
  int64_t type;
  const char* name;
  int64_t super_weights, meta_bytes, kblock_bytes;
  int64_t super_bytes() const { return meta_bytes + super_weights / kBlock * kblock_bytes; }
};

constexpr TileFormat kTileFormats[] = {
    {kQ8_0, "Q8_0", 32, 32, 512}, {kQ4_0, "Q4_0", 32, 32, 256}, {kQ4_1, "Q4_1", 32, 64, 256},
    {kQ4_K, "Q4_K", 256, 320, 256}, {kQ6_K, "Q6_K", 256, 288, 384},
};

// The tile layout of ggml type `type`; nullptr for a type without one.
inline const TileFormat* find_tile_format(int64_t type) {
  for (const auto& format : kTileFormats) {
    if (format.type == type) return &format;
  }
  return nullptr;
}

// Rows of activations quantized per K-block: q[m * k + i] int8, step[m * k / 32 + b] (the block's dequantization
// step: absolute maximum / 127; 0 for a zero block, NaN for one holding NaN or inf), offset32[m * k / 32 + b] = -128
// x the block's sum of q (what Q8_0's stored q + 128 adds to a dot product, to take back in int32), sum32 = step x
// that sum, offset16[m * k / 16 + h] = -32 x the sum of q over each 16 values (what Q6_K's stored q adds beyond its
// q - 32, taken back the same way). A view may cover a slice of the rows' K: then k is the slice's length, the
// pointers start at its first K-block, and row_blocks (the rows' K over 32) is the stride of a row (q: row_blocks *
// 32 bytes; step, offset32 and sum32: row_blocks entries, offset16 twice as many).
struct Activations {
  const int8_t* q;
  const float* step;
  const int32_t* offset32;
  const float* sum32;
  const int32_t* offset16;
  int64_t k;
  int64_t row_blocks;
};

// out[(m0 + r) * ld_out + c] = bias[c] + sum_k w[c][k] * x[m0 + r][k] for r < rows, c < cols (<= 16): one tile
// (`tile`, the format's super-blocks over x's k) times rows m0 .. m0 + rows of the activations (dequantized:
// q * step). bias may be null; rows <= kChunkRows. `accumulate`: out already holds the sums over the K before x's
// slice, and the slice's blocks are added to them in order (so slicing K changes no bit of the result).
constexpr int64_t kChunkRows = 8;
using TileKernel = void (*)(const uint8_t* tile, const Activations& x, int64_t m0, int64_t rows, float* out,
                            int64_t ld_out, int64_t cols, const float* bias, bool accumulate);

// Software prefetch while streaming a tile (the AVX2 and AVX-512 kernels): into L1 kPrefetchBytes ahead, into L2
// kPrefetchL2Bytes ahead; the L2 request keeps more lines in flight than the L1 one alone. GB/s of weights at 1 row
// (4,096 x 14,336 and 14,336 x 4,096, read once per call; before / after, interleaved runs, Zen 4): AVX-512 Q4_K
// 41 / 47, Q6_K 31 / 39, Q8_0 48 / 47, at 4 rows 1.14-1.28x, at 16 and 256 rows within 2%; AVX2 (forced on the same
// CPU) Q4_K 30-37 / 34-36, Q6_K 15-25 / 29-38, at 64 and 256 rows within 3%.
constexpr int64_t kPrefetchBytes = 4096, kPrefetchL2Bytes = 32768;

TileKernel portable_kernel(int64_t type);
TileKernel avx2_kernel(int64_t type);
TileKernel avx512_kernel(int64_t type);

// One K-block of 32 activations quantized as gguf_activations.cpp's scalar quantize_block does (the same results),
// with AVX-512 (only where isa::cpu_has_avx512()) or AVX2 (isa::cpu_has_avx2()): gguf_quantize_simd.cpp.
void quantize_block_avx512(const float* x, int8_t* q, float* step, int32_t* offset32, float* sum32, int32_t* offset16);
void quantize_block_avx2(const float* x, int8_t* q, float* step, int32_t* offset32, float* sum32, int32_t* offset16);

// Row `row` (< 16) of a tile, dequantized to `k` floats at `out` with the float operations of
// radixlm.model.gguf_blocks.dequantize (so equal to it).
void dequantize_tile_row(int64_t type, const uint8_t* tile, int64_t k, int64_t row, float* out);

inline uint16_t load_u16(const uint8_t* p) {  // metadata fields need not be aligned
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace radixlm_gguf
