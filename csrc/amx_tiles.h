// AMX's tile set-up, shared by the kernels that use its bfloat16 tiles (linear/amx_bf16.cpp,
// attention/prefill_attention.cpp). Whether the CPU has the tiles and the OS lets this process use them is
// radixlm::amx_bf16_available() (linear/amx_bf16.h), asked before any tile instruction runs.
#pragma once

#include <cstdint>

#include "isa.h"

namespace radixlm::amx {

struct alignas(64) TileConfig {  // the layout LDTILECFG reads (palette 1)
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Every one of the 8 tiles 16 rows of 64 bytes, on the calling thread: 16 x 16 float32 for a product, 16 rows of
// 32 bfloat16 (16 pairs) for an operand. The kernels then name tiles by number.
RADIXLM_AMX inline void configure_tiles() {
  TileConfig config{};
  config.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  // GCC 12 does not count LDTILECFG as a read of `config` and dropped the stores above; this barrier keeps them.
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

// Ends the calling thread's use of the tiles (their state back to the initial one).
RADIXLM_AMX inline void release_tiles() { _tile_release(); }

}  // namespace radixlm::amx
