// The pair layouts the bfloat16 attention kernels read keys and values in (prefill_attention.cpp's header comment):
// which cache rows make up each packed 64-key block, and the packing of one block. Shared by the prefill kernel and
// the decode kernel's shared-prefix part (decode_cascade.cpp); internal linkage, as prefill_blocks.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "../transpose16.h"
#include "prefill_blocks.h"

namespace radixlm_prefill {

namespace {

// The keys to pack: block g holds the K/V rows at slots[g * kKeys + c] of the sources (-1: past the context, zeros).
struct Packing {
  Rows k, v;
  std::vector<int64_t> slots;
  int64_t num_groups() const { return static_cast<int64_t>(slots.size()) / kKeys; }
};

// Block g of KV head h in the pair layouts, one word at a time: any head size (a multiple of 2).
inline void pack_block_scalar(const Problem& p, const Packing& src, int64_t g, int64_t h) {
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

// 32 bfloat16 from `row`, zeros for a missing one (a position past the context).
RADIXLM_AVX512_BF16 inline __m512i load(const uint16_t* row) {
  return row != nullptr ? _mm512_loadu_si512(row) : _mm512_setzero_si512();
}

// pack_block_scalar's words for a head size that is a multiple of 32, 16 keys' words at a time through transpose16
// and two values' rows interleaved by unpacking: the same words, about a third of the instructions (packing was most
// of the decode kernel's shared part).
RADIXLM_AVX512_BF16 inline void pack_block_avx512(const Problem& p, const Packing& src, int64_t g, int64_t h) {
  const int64_t half = p.head_dim / 2, d = p.head_dim;
  uint32_t* kdst = const_cast<uint32_t*>(p.key_block(g, h));
  uint32_t* vdst = const_cast<uint32_t*>(p.value_block(g, h));
  const int64_t* slots = src.slots.data() + g * kKeys;
  for (int64_t c0 = 0; c0 < kKeys; c0 += 16) {
    for (int64_t i0 = 0; i0 < half; i0 += 16) {
      __m512i r[16];
      for (int c = 0; c < 16; ++c) r[c] = load(slots[c0 + c] >= 0 ? src.k.at(slots[c0 + c], h) + 2 * i0 : nullptr);
      radixlm::transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(kdst + (i0 + j) * kKeys + c0, r[j]);
    }
  }
  const __m512i first_half = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second_half = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t pair = 0; pair < kKeys / 2; ++pair) {
    const uint16_t* first = slots[2 * pair] >= 0 ? src.v.at(slots[2 * pair], h) : nullptr;
    const uint16_t* second = slots[2 * pair + 1] >= 0 ? src.v.at(slots[2 * pair + 1], h) : nullptr;
    for (int64_t e0 = 0; e0 < d; e0 += 32) {
      const __m512i a = load(first != nullptr ? first + e0 : nullptr);
      const __m512i b = load(second != nullptr ? second + e0 : nullptr);
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);  // lane l: 8l .. 8l + 3, + 4
      _mm512_storeu_si512(vdst + pair * d + e0, _mm512_permutex2var_epi64(lo, first_half, hi));
      _mm512_storeu_si512(vdst + pair * d + e0 + 16, _mm512_permutex2var_epi64(lo, second_half, hi));
    }
  }
}

// Block g of KV head h in the pair layouts (the caller's CPU has AVX-512 BF16, as every user of these layouts).
inline void pack_block(const Problem& p, const Packing& src, int64_t g, int64_t h) {
  if (p.head_dim % 32 == 0) {
    pack_block_avx512(p, src, g, h);
  } else {
    pack_block_scalar(p, src, g, h);
  }
}

}  // namespace

}  // namespace radixlm_prefill
