// The AMX prefill steps for head sizes up to 64 (prefill_attention.cpp): a group of 16 query rows keeps its output in
// tiles over all its keys, 32 keys a step, and the next step's scores are on the tiles while this step's softmax
// runs on the vector units.
//
// Why: with the output stored and reloaded each block (prefill_tiles.h's amx_block), every tile step waited on the
// one before it: the scores' stores on their products, the softmax on those stores, the values' products on the
// softmax's probabilities, and the tiles sat idle during the softmax. Tiles: the output 0-3 (16 x 16 float32 each,
// D / 16 of them), the scores 4-5 (32 keys), an A operand 6 and a B operand 7 (and 4-5 for the values' B operands,
// once the scores in them are stored). Needs D 32 or 64. A 2,000-token prefill of the default model's shape (9/3
// heads of 64, 2 threads): 7.3 -> 5.4 ms a layer with kMaxSlack and whole_step_softmax; those two alone, on the
// 64-key path, gave head sizes of 128 1.2x.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>

#include "../isa.h"
#include "prefill_blocks.h"
#include "prefill_tiles.h"

namespace radixlm_prefill {

constexpr int64_t kResidentDim = 64;  // the largest head size whose output fits the 4 tiles this path keeps it in
constexpr int64_t kStepKeys = 32;     // keys per resident step: two score tiles
constexpr int kStepVecs = kStepKeys / 16;  // 16-lane score vectors per row and step

namespace {

// The products of step `s` of the 16 rows from r0 into tiles 4-5: its keys are half s % 2 of key block `kblock`.
RADIXLM_AMX inline void resident_scores(const Problem& p, const Scratch& w, int64_t r0, const uint32_t* kblock,
                                        int64_t s) {
  const int64_t half = p.head_dim / 2;
  const uint32_t* keys = kblock + (s % 2) * kStepKeys;
  _tile_zero(4);
  _tile_zero(5);
  for (int64_t i0 = 0; i0 < half; i0 += 16) {
    _tile_loadd(6, w.q.data() + r0 * half + i0, half * 4);
    _tile_loadd(7, keys + i0 * kKeys, kKeys * 4);
    _tile_dpbf16ps(4, 6, 7);
    _tile_loadd(7, keys + i0 * kKeys + 16, kKeys * 4);
    _tile_dpbf16ps(5, 6, 7);
  }
}

RADIXLM_AMX inline void store_scores(Scratch& w, int64_t r0) {
  float* s = w.scores.data() + r0 * kStepKeys;
  _tile_stored(4, s, kStepKeys * 4);
  _tile_stored(5, s + 16, kStepKeys * 4);
}

// The rows r0 .. end - 1 whose running max moved this step have their output scaled by its factor: the tiles go
// through memory for it, which the steps of a long row seldom need.
template <int kTiles>
RADIXLM_AMX inline void rescale_output(const Problem& p, Scratch& w, int64_t r0, int64_t end) {
  bool any = false;
  for (int64_t r = r0; r < end; ++r) any |= w.alpha[r] != 1.f;
  if (!any) return;
  store_product_tiles<kTiles>(w.out.data() + r0 * p.head_dim, p.head_dim);
  scale_rows(p, w, r0, end);
  load_product_tiles<kTiles>(w.out.data() + r0 * p.head_dim, p.head_dim);
}

// output += probs . v over step s's 32 keys (key pairs 16 (s % 2) .. of value block `vblock`).
template <int kTiles>
RADIXLM_AMX inline void resident_values(const Problem& p, const Scratch& w, int64_t r0, const uint32_t* vblock,
                                        int64_t s) {
  const int64_t d = p.head_dim;
  const uint32_t* v = vblock + (s % 2) * (kStepKeys / 2) * d;
  // amx_values_part's products with other tiles (the intrinsics take tile numbers as literals): B rotates through
  // 7, 4, 5 so that each load need not wait for the product before it to release its tile.
  _tile_loadd(6, w.probs.data() + r0 * kStepKeys / 2, kStepKeys * 2);
  _tile_loadd(7, v, d * 4);
  _tile_dpbf16ps(0, 6, 7);
  _tile_loadd(4, v + 16, d * 4);
  _tile_dpbf16ps(1, 6, 4);
  if constexpr (kTiles == 4) {
    _tile_loadd(5, v + 32, d * 4);
    _tile_dpbf16ps(2, 6, 5);
    _tile_loadd(7, v + 48, d * 4);
    _tile_dpbf16ps(3, 6, 7);
  }
}

// The 16 rows from r0 (those before `end` real) over their steps first_step .. last_step, their output left in w.out
// (not yet divided by the sums). `blocks(b)` gives key block b's packed keys and values; row r sits at position(r).
template <int kTiles, typename Blocks, typename Position>
RADIXLM_AMX inline void resident_group(const Problem& p, Scratch& w, int64_t r0, int64_t end, int64_t first_step,
                                       int64_t last_step, Blocks blocks, Position position) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kTiles == 4) {
    _tile_zero(2);
    _tile_zero(3);
  }
  auto [kblock, vblock] = blocks(first_step / 2);
  resident_scores(p, w, r0, kblock, first_step);
  store_scores(w, r0);
  for (int64_t s = first_step; s <= last_step; ++s) {
    const uint32_t* this_values = vblock;
    if (s < last_step) {  // the next step's products start before this step's softmax
      if ((s + 1) % 2 == 0) std::tie(kblock, vblock) = blocks((s + 1) / 2);
      resident_scores(p, w, r0, kblock, s + 1);
    }
    const int64_t key0 = s * kStepKeys;
    if (sees_whole(p, r0, end, key0, kStepKeys, position)) {
      whole_step_softmax<kStepVecs>(p, w, r0, end);
    } else {
      for (int64_t r = r0; r < end; ++r) block_softmax<kStepVecs>(p, w, r, position(r), key0);
    }
    // The next scores' stores before this step's values: their products are done by now, and the values take
    // tiles 4-5 for operands.
    if (s < last_step) store_scores(w, r0);
    rescale_output<kTiles>(p, w, r0, end);
    resident_values<kTiles>(p, w, r0, this_values, s);
  }
  store_product_tiles<kTiles>(w.out.data() + r0 * p.head_dim, p.head_dim);
}

// An item's `rows` rows (already in w, begun: begin_rows) on the tiles, 16 at a time, each group over the steps its
// rows see; their outputs left in w.out. Needs D 32 or 64 (kResidentDim).
template <typename Blocks, typename Position>
RADIXLM_AMX inline void resident_rows(const Problem& p, Scratch& w, int64_t rows, Blocks blocks, Position position) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t end = std::min(rows, r0 + 16);
    const int64_t first_step = p.first_key(position(r0)) / kStepKeys, last_step = position(end - 1) / kStepKeys;
    if (p.head_dim == 64) {
      resident_group<4>(p, w, r0, end, first_step, last_step, blocks, position);
    } else {
      resident_group<2>(p, w, r0, end, first_step, last_step, blocks, position);
    }
  }
}

}  // namespace

}  // namespace radixlm_prefill
