// The GGUF linear's AMX path (gguf_amx.cpp), called by linear_gguf.cpp for its path kGgufPathAmx.
#pragma once

#include <cstdint>

#include "../isa.h"

namespace radixlm_gguf {

// One part of a fused GGUF weight: its tiles (gguf_kernels.h's layout, ggml type `type`), `out_features` rows
// written from output column `first_column`.
struct AmxPart {
  const uint8_t* tiles;
  int64_t type, tile_bytes, out_features, first_column;
};

// out[M, N] = x[M, K] W^T (+ bias) with x and out bfloat16 (raw 16-bit values), bias float32 [N] or null, and W the
// parts, each dequantized to bfloat16 (q * scale + offset in float32, then rounded) and multiplied on AMX tiles in
// float32. K a multiple of 256 where a part is Q4_K or Q6_K, of 32 otherwise. Needs radixlm::amx_bf16_available().
void amx_linear(const uint16_t* x, int64_t M, int64_t K, const AmxPart* parts, int64_t num_parts, const float* bias,
                uint16_t* out, int64_t N);

}  // namespace radixlm_gguf
