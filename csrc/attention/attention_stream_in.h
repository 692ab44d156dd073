// Streaming a work item's K/V into L2 before attending it, for the paged decode kernel (paged_attention.cpp).
// Included by that file only; the namespace keeps these names to it.
//
// A work item that reads every KV head reads each position's K row and V row as one contiguous run each, and a
// request's blocks are mostly one run too (the block pool keeps them so). Interleaving those reads with the
// arithmetic, even with software prefetches one tile ahead, kept too few misses in flight: on this 2-core machine the
// kernel cost about its memory time plus its arithmetic. Instead, before attending each chunk of positions, the item
// reads the chunk's blocks in a tight loop of loads, four streams at once (K and V of the chunk's first and second
// halves), which runs at about the bandwidth of a plain streaming read (0.95x the time of `amax` over the same
// bytes, 64 requests x 256 positions); the tiles then compute from L2 with no software prefetch. Measured at 64 x 256
// positions against the same bytes' `amax`: 1.35x -> 1.11x in a slow-memory moment, 1.64x -> 1.35x in a fast one.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attention_plan.h"
#include "attention_tiles.h"

namespace radixlm_attention {

// K plus V bytes of one chunk: it must stay in L2 while its tiles are attended. On a Zen 5 core (1 MiB of L2) 768 KiB
// chunks were slower than 384 KiB ones and 192 KiB ones no faster; on a Xeon core (2 MiB of L2, about half the
// memory bandwidth per core) 192 KiB ones took 5% less than 384 KiB ones (64 x 1,024 positions: 141 -> 134 ms a step;
// 64 x 256: 37.5 -> 35.4; bfloat16 64 x 1,024: 102 -> 99), 96 KiB ones the same as 192, 768 KiB and 1.5 MiB ones 12%
// more.
constexpr int64_t kStreamInBytes = 192 << 10;

// Positions per chunk for rows of `row_bytes` bytes (one position's K, all heads): whole tiles, at least one.
inline int64_t stream_in_positions(int64_t row_bytes) {
  return std::max<int64_t>(kTile, kStreamInBytes / (2 * row_bytes) / kTile * kTile);
}

// Loads one word of every 64-byte line of the kRuns runs of `bytes` bytes at `runs`, line by line across the runs
// (so that their streams run side by side), last line first, and keeps the loads from being optimised away.
template <int64_t kRuns>
inline void read_lines(const char* const (&runs)[kRuns], int64_t bytes) {
  uint64_t sink[kRuns] = {};
  for (int64_t line = bytes - 64; line >= 0; line -= 64) {
    for (int64_t r = 0; r < kRuns; ++r) {
      uint64_t word;
      std::memcpy(&word, runs[r] + line, sizeof(word));  // one load; memcpy keeps it free of aliasing rules
      sink[r] ^= word;
    }
  }
  for (int64_t r = 0; r < kRuns; ++r) asm volatile("" : : "r"(sink[r]));
}

// Brings the K and V rows of positions [start, stop) of a request (its blocks at `blocks`) into cache: whole block k
// of the chunk's first half together with whole block k of its second half, K and V of each. The blocks are read
// last to first (the prefetchers follow a descending stream as well), so the lines the first tiles need are the
// freshest in cache when the arithmetic starts: 0.4 ms off the 64 x 256 step from cache (7.0 -> 6.6 ms), 2-4% from
// memory. A block the chunk holds only part of (its first or last) is read for those positions only, on its own:
// reading all of a last block that holds one position cost 7% of a 64 x 257 step.
template <typename scalar_t>
void stream_in(const Problem& p, const int32_t* blocks, const scalar_t* keys, const scalar_t* values, int64_t start,
               int64_t stop) {
  const int64_t bs = p.block_size, first_block = start / bs, last_block = (stop - 1) / bs;
  const int64_t row_bytes = p.num_kv_heads * p.head_dim * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t block_bytes = bs * row_bytes, block_elements = bs * p.num_kv_heads * p.head_dim;
  const auto at = [&](const scalar_t* base, int64_t block) {
    return reinterpret_cast<const char*>(base + static_cast<int64_t>(blocks[block]) * block_elements);
  };
  // The lines of block k that hold positions of [start, stop), as K and V runs of their own.
  const auto read_part = [&](int64_t k) {
    const int64_t lo = std::max<int64_t>(start - k * bs, 0) * row_bytes / 64 * 64;
    const int64_t hi = std::min(block_bytes, (std::min(stop - k * bs, bs) * row_bytes + 63) / 64 * 64);
    const char* const runs[2] = {at(keys, k) + lo, at(values, k) + lo};
    read_lines(runs, hi - lo);
  };
  const bool first_whole = start == first_block * bs, last_whole = stop == (last_block + 1) * bs;
  if (first_block == last_block && !(first_whole && last_whole)) {
    read_part(first_block);
    return;
  }
  if (!last_whole) read_part(last_block);
  const int64_t lo = first_whole ? first_block : first_block + 1, hi = last_whole ? last_block : last_block - 1;
  const int64_t half = (hi - lo + 2) / 2;
  for (int64_t k = lo + half - 1; k >= lo; --k) {
    const int64_t partner = k + half;
    if (partner <= hi) {
      const char* const runs[4] = {at(keys, k), at(values, k), at(keys, partner), at(values, partner)};
      read_lines(runs, block_bytes);
    } else {
      const char* const runs[2] = {at(keys, k), at(values, k)};
      read_lines(runs, block_bytes);
    }
  }
  if (!first_whole) read_part(first_block);
}

}  // namespace radixlm_attention
