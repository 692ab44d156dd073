// The pair layouts the bfloat16 attention kernels read keys and values in (prefill_attention.cpp's header comment):
// which cache rows make up each packed 64-key block, and the packing of one block. Shared by the prefill kernel and
// the decode kernel's shared-prefix part (decode_cascade.cpp); internal linkage, as prefill_blocks.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "prefill_blocks.h"

namespace radixlm_prefill {

namespace {

// The keys to pack: block g holds the K/V rows at slots[g * kKeys + c] of the sources (-1: past the context, zeros).
struct Packing {
  Rows k, v;
  std::vector<int64_t> slots;
  int64_t num_groups() const { return static_cast<int64_t>(slots.size()) / kKeys; }
};

// Block g of KV head h in the pair layouts.
inline void pack_block(const Problem& p, const Packing& src, int64_t g, int64_t h) {
  const int64_t half = p.head_dim / 2, d = p.head_dim;
  uint32_t* kdst = const_cast<uint32_t*>(p.key_block(g, h));
  uint32_t* vdst = const_cast<uint32_t*>(p.value_block(g, h));
  const int64_t* slots = src.slots.data() + g * kKeys;
  for (int64_t c = 0; c < kKeys; ++c) {
    const uint16_t* row = slots[c] >= 0 ? src.k.at(slots[c], h) : nullptr;
    for (int64_t i = 0; i < half; ++i) {
      uint32_t word = 0;
      if (row != nullptr) std::memcpy(&word, row + 2 * i, sizeof(word));
      kdst[i * kKeys + c] = word;
    }
  }
  for (int64_t pair = 0; pair < kKeys / 2; ++pair) {
    const uint16_t* first = slots[2 * pair] >= 0 ? src.v.at(slots[2 * pair], h) : nullptr;
    const uint16_t* second = slots[2 * pair + 1] >= 0 ? src.v.at(slots[2 * pair + 1], h) : nullptr;
    for (int64_t e = 0; e < d; ++e) {
      const uint32_t lo = first != nullptr ? first[e] : 0, hi = second != nullptr ? second[e] : 0;
      vdst[pair * d + e] = lo | (hi << 16);
    }
  }
}

}  // namespace

}  // namespace radixlm_prefill
