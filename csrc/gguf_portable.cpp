// The GGUF linear's portable kernels (see gguf_kernels.h): plain loops written as the reference computes, which the
// compiler vectorizes for whatever the build targets. They run where the CPU lacks AVX2 and serve as the second
// implementation the tests compare the AVX2 one with.

#include "gguf_kernels.h"

#include <c10/util/Half.h>

#include <cstring>

namespace radixlm_gguf {
namespace {

inline float half_at(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(load_u16(p)); }

void decode_q8_0(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
    const float d = half_at(src);
    for (int i = 0; i < 32; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(src[2 + i])) * d;
  }
}

void decode_q4_0(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
    const float d = half_at(src);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * static_cast<float>((src[2 + i] & 15) - 8);
      dst[i + 16] = d * static_cast<float>((src[2 + i] >> 4) - 8);
    }
  }
}

void decode_q4_1(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 20, dst += 32) {
    const float d = half_at(src), m = half_at(src + 2);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * static_cast<float>(src[4 + i] & 15) + m;
      dst[i + 16] = d * static_cast<float>(src[4 + i] >> 4) + m;
    }
  }
}

void decode_q4_k(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 144, dst += 256) {
    const float d = half_at(src), dmin = half_at(src + 2);
    const Q4KScales packed = q4_k_scales(src + 4);
    float scale[8], offset[8];
    for (int j = 0; j < 8; ++j) {
      scale[j] = d * static_cast<float>((packed.scales >> (8 * j)) & 0xFF);
      offset[j] = dmin * static_cast<float>((packed.mins >> (8 * j)) & 0xFF);
    }
    for (int g = 0; g < 4; ++g) {  // 32 bytes: sub-block 2g in the low nibbles, 2g + 1 in the high ones
      const uint8_t* q = src + 16 + 32 * g;
      const float s0 = scale[2 * g], m0 = offset[2 * g], s1 = scale[2 * g + 1], m1 = offset[2 * g + 1];
      for (int i = 0; i < 32; ++i) {
        dst[64 * g + i] = s0 * static_cast<float>(q[i] & 15) - m0;
        dst[64 * g + 32 + i] = s1 * static_cast<float>(q[i] >> 4) - m1;
      }
    }
  }
}

void decode_q6_k(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 210, dst += 256) {
    const float d = half_at(src + 208);
    float scale[16];
    for (int j = 0; j < 16; ++j) scale[j] = d * static_cast<float>(static_cast<int8_t>(src[192 + j]));
    for (int h = 0; h < 2; ++h) {  // a half: 64 bytes of low nibbles, 32 of 2-bit pairs
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + 128 + 32 * h;
      float* out = dst + 128 * h;
      for (int i = 0; i < 32; ++i) {
        const int q[4] = {(ql[i] & 15) | ((qh[i] & 3) << 4), (ql[i + 32] & 15) | (((qh[i] >> 2) & 3) << 4),
                          (ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4), (ql[i + 32] >> 4) | ((qh[i] >> 6) << 4)};
        for (int s = 0; s < 4; ++s) {
          out[32 * s + i] = scale[8 * h + 2 * s + i / 16] * static_cast<float>(q[s] - 32);
        }
      }
    }
  }
}

typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Dot's contract for kRows activation rows and kTile weight rows, accumulated in registers.
template <int kRows, int kTile>
void dot_group(const float* x, int64_t ldx, const float* w, int64_t len, float* partial) {
  v8f acc[kRows][kTile] = {};
  for (int64_t k = 0; k < len; k += 8) {
    v8f wv[kTile];
    for (int t = 0; t < kTile; ++t) wv[t] = load8(w + t * kSpan + k);
    for (int r = 0; r < kRows; ++r) {
      const v8f xv = load8(x + r * ldx + k);
      for (int t = 0; t < kTile; ++t) acc[r][t] += xv * wv[t];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kTile; ++t) {
      float sum = 0.f;
      for (int i = 0; i < 8; ++i) sum += acc[r][t][i];
      partial[r * kTileRows + t] += sum;
    }
  }
}

template <int kTile>
void dot_rows(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t len, float* partial) {
  int64_t m = 0;
  for (; m + 2 <= rows; m += 2) dot_group<2, kTile>(x + m * ldx, ldx, w, len, partial + m * kTileRows);
  if (m < rows) dot_group<1, kTile>(x + m * ldx, ldx, w, len, partial + m * kTileRows);
}

void dot(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t tile_rows, int64_t len, float* partial) {
  if (tile_rows == kTileRows) return dot_rows<kTileRows>(x, ldx, rows, w, len, partial);
  for (int64_t t = 0; t < tile_rows; ++t) dot_rows<1>(x, ldx, rows, w + t * kSpan, len, partial + t);
}

}  // namespace

Kernels portable_kernels(int64_t type) {
  switch (type) {
    case kQ8_0: return {decode_q8_0, dot, nullptr};
    case kQ4_0: return {decode_q4_0, dot, nullptr};
    case kQ4_1: return {decode_q4_1, dot, nullptr};
    case kQ4_K: return {decode_q4_k, dot, nullptr};
    case kQ6_K: return {decode_q6_k, dot, nullptr};
    default: return {nullptr, nullptr, nullptr};
  }
}

}  // namespace radixlm_gguf
