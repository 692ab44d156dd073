// GGUF's block formats and the per-instruction-set kernels of the GGUF linear (linear_gguf.cpp): a portable one
// (gguf_portable.cpp, plain C++ the compiler vectorizes for the build's flags) and an AVX2 + FMA + F16C one
// (gguf_avx2.cpp, intrinsics in functions compiled for those extensions whatever the build's flags, run only when
// the CPU reports them). The layouts are ggml's; radixlm/model/gguf_blocks.py is the reference.
#pragma once

#include <cstdint>
#include <cstring>

namespace radixlm_gguf {

// ggml type ids (gguf.GGMLQuantizationType).
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14;

// A block format: `weights` consecutive weights of a row stored in `bytes` bytes.
struct Format {
  int64_t type;
  const char* name;
  int64_t weights, bytes;
};

constexpr Format kFormats[] = {
    {kQ4_0, "Q4_0", 32, 18}, {kQ4_1, "Q4_1", 32, 20}, {kQ8_0, "Q8_0", 32, 34},
    {kQ4_K, "Q4_K", 256, 144}, {kQ6_K, "Q6_K", 256, 210},
};

// The kernel works on tiles of kTileRows weight rows by spans of at most kSpan weights: it unpacks a tile's span
// into a float buffer of kTileRows x kSpan (8 KiB: stays in L1 beside the activations' span), then multiplies it
// with every activation row, so each unpacked weight serves all rows and each activation vector loaded serves the
// tile's rows. kSpan is a multiple of every format's block.
constexpr int64_t kTileRows = 4;
constexpr int64_t kSpan = 512;

// Unpacks `blocks` consecutive blocks at `src` into blocks * weights floats at `dst`: the reference's weights
// (the same float operations, except that the AVX2 Q4_1 / Q4_K ones round d q + m once, with a fused multiply-add).
using Decode = void (*)(const uint8_t* src, int64_t blocks, float* dst);

// partial[m * kTileRows + t] += sum_{k < len} x[m * ldx + k] * w[t * kSpan + k] for m < rows, t < tile_rows
// (len a multiple of 8, tile_rows <= kTileRows).
using Dot = void (*)(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t tile_rows, int64_t len,
                     float* partial);

// out[m * ld_out] = sum_{k < K} x[m * ldx + k] * w[k] for m < rows <= kFusedRows, w the K = blocks * weights weights
// of the `blocks` blocks at src (a whole row), given xsum [rows, K / 32], the sums of x over each 32 weights: Decode
// and Dot in one pass, the unpacked weights kept in registers.
using Fused = void (*)(const uint8_t* src, int64_t blocks, const float* x, int64_t ldx, const float* xsum,
                       int64_t rows, float* out, int64_t ld_out);

// Up to this many rows, a Fused kernel (where there is one) is faster than Decode + Dot: it skips the buffer's
// stores and loads (at one row, about a third of their instructions), and its activation rows fit in registers.
constexpr int64_t kFusedRows = 4;

struct Kernels {
  Decode decode;  // null: the format is not supported
  Dot dot;
  Fused fused;  // null: none, Decode + Dot serve every row count
};

Kernels portable_kernels(int64_t type);
Kernels avx2_kernels(int64_t type);
bool cpu_has_avx2();  // AVX2, FMA and F16C, with the OS saving the YMM registers

inline uint16_t load_u16(const uint8_t* p) {  // blocks are packed: their float16 fields need not be aligned
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Q4_K's 8 six-bit scales and 8 mins from its 12 packed bytes `s`, byte j of `scales` / `mins` being scale / min j:
// bytes 0-3 / 4-7 hold scales / mins 0-3 in their low 6 bits and the top 2 bits of 4-7 in their high 2; bytes 8-11
// hold the low 4 bits of scales (low nibble) and mins (high nibble) 4-7. Worked four bytes at a time in 32-bit words
// (little-endian), each byte's bits masked apart: a tenth of the instructions of a loop over the bytes.
struct Q4KScales {
  uint64_t scales, mins;
};

inline Q4KScales q4_k_scales(const uint8_t* s) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the GGUF kernels read little-endian words");
  uint32_t w[3];
  std::memcpy(w, s, sizeof(w));
  const uint64_t scales_lo = w[0] & 0x3F3F3F3Fu, mins_lo = w[1] & 0x3F3F3F3Fu;
  const uint64_t scales_hi = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u);
  const uint64_t mins_hi = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u);
  return {scales_lo | scales_hi << 32, mins_lo | mins_hi << 32};
}

}  // namespace radixlm_gguf
