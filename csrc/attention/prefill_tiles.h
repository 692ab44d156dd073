// The AMX steps of the prefill attention for head sizes above 64 (prefill_attention.cpp): the scores and values of
// prefill_blocks.h on tiles (amx_tiles.h's configuration, loaded by the calling thread), one group of 16 rows at a
// time, a 64-key block at a time, the group's output loaded into the tiles and stored back each block. (Head sizes
// up to 64 keep their output on the tiles instead: prefill_resident.h, which shares the helpers here.)
#pragma once

#include <algorithm>
#include <cstdint>

#include "../isa.h"
#include "prefill_blocks.h"

namespace radixlm_prefill {

namespace {

// A group past the item's last row computes on whatever its scratch holds and is never read. The packed layouts are
// already the tiles' operands: a key block's pair lines are B for q . k (16 keys a tile, lines 256 bytes apart) and a
// value block's key-pair lines B for probs . v (16 dimensions a tile, lines 4 D bytes apart). Needs D a multiple of
// 32 (an operand tile's 16 pairs). Tiles: products 0-3, A 4, B 5-7.

// w.out's rows r0 .. end - 1 scaled by their factors (w.alpha) where these are not 1.
RADIXLM_AVX512_BF16 inline void scale_rows(const Problem& p, Scratch& w, int64_t r0, int64_t end) {
  for (int64_t r = r0; r < end; ++r) {
    if (w.alpha[r] == 1.f) continue;
    const __m512 alpha = _mm512_set1_ps(w.alpha[r]);
    float* out = w.out.data() + r * p.head_dim;
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += 16) {
      _mm512_storeu_ps(out + d0, _mm512_mul_ps(_mm512_loadu_ps(out + d0), alpha));
    }
  }
}

// Product tiles 0 .. kTiles - 1 (2 or 4) from or to 16 rows of float32 `stride` floats apart, 16 columns a tile.
template <int kTiles>
RADIXLM_AMX inline void load_product_tiles(const float* rows, int64_t stride) {
  _tile_loadd(0, rows, stride * 4);
  _tile_loadd(1, rows + 16, stride * 4);
  if constexpr (kTiles == 4) {
    _tile_loadd(2, rows + 32, stride * 4);
    _tile_loadd(3, rows + 48, stride * 4);
  }
}

template <int kTiles>
RADIXLM_AMX inline void store_product_tiles(float* rows, int64_t stride) {
  _tile_stored(0, rows, stride * 4);
  _tile_stored(1, rows + 16, stride * 4);
  if constexpr (kTiles == 4) {
    _tile_stored(2, rows + 32, stride * 4);
    _tile_stored(3, rows + 48, stride * 4);
  }
}

// scores[r, 0 .. kKeys) = q[r] . k[block's keys] for the 16 rows from r0, in four 16 x 16 products.
RADIXLM_AMX inline void amx_group_scores(const Problem& p, Scratch& w, int64_t r0, const uint32_t* kblock) {
  const int64_t half = p.head_dim / 2;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i0 = 0; i0 < half; i0 += 16) {
    const uint32_t* k = kblock + i0 * kKeys;
    _tile_loadd(4, w.q.data() + r0 * half + i0, half * 4);
    _tile_loadd(5, k, kKeys * 4);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, k + 16, kKeys * 4);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, k + 32, kKeys * 4);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, k + 48, kKeys * 4);
    _tile_dpbf16ps(3, 4, 5);
  }
  float* s = w.scores.data() + r0 * kKeys;
  _tile_stored(0, s, kKeys * 4);
  _tile_stored(1, s + 16, kKeys * 4);
  _tile_stored(2, s + 32, kKeys * 4);
  _tile_stored(3, s + 48, kKeys * 4);
}

// out[r0 .. r0 + 16, d0 .. d0 + 16 kTiles) += probs[r0 .. r0 + 16] . v[block][:, d0 ..]: the output rows are the
// product tiles themselves, loaded and stored back.
template <int kTiles>
RADIXLM_AMX inline void amx_values_part(const Problem& p, Scratch& w, int64_t r0, int64_t d0,
                                        const uint32_t* vblock) {
  const int64_t d = p.head_dim;
  float* out = w.out.data() + r0 * d + d0;
  load_product_tiles<kTiles>(out, d);
  for (int64_t pair0 = 0; pair0 < kKeys / 2; pair0 += 16) {
    const uint32_t* v = vblock + pair0 * d + d0;
    _tile_loadd(4, w.probs.data() + r0 * kKeys / 2 + pair0, kKeys * 2);
    _tile_loadd(5, v, d * 4);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, v + 16, d * 4);
    _tile_dpbf16ps(1, 4, 6);
    if constexpr (kTiles == 4) {
      _tile_loadd(7, v + 32, d * 4);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, v + 48, d * 4);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  store_product_tiles<kTiles>(out, d);
}

// out[r] = alpha[r] * out[r] + probs[r] . v[block] for the 16 rows from r0 (those before `end` real): the rows
// whose factor is not 1 (a running max that moved: few blocks of a long row) scaled first, then the products.
RADIXLM_AMX inline void amx_group_values(const Problem& p, Scratch& w, int64_t r0, int64_t end,
                                         const uint32_t* vblock) {
  scale_rows(p, w, r0, end);
  for (int64_t d0 = 0; d0 < p.head_dim; d0 += 64) {
    if (p.head_dim - d0 >= 64) {
      amx_values_part<4>(p, w, r0, d0, vblock);
    } else {
      amx_values_part<2>(p, w, r0, d0, vblock);
    }
  }
}

// Key block b (its packed keys and values) against the item's `rows` rows on the tiles, each 16-row group through
// scores, softmax and values before the next, so that its scratch stays in L1; row r sits at position(r).
template <typename Position>
RADIXLM_AMX inline void amx_block(const Problem& p, Scratch& w, int64_t rows, int64_t b, const uint32_t* kblock,
                                  const uint32_t* vblock, Position position) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t end = std::min(rows, r0 + 16);
    amx_group_scores(p, w, r0, kblock);
    if (sees_whole(p, r0, end, b * kKeys, kKeys, position)) {
      whole_step_softmax<kKeyVecs>(p, w, r0, end);
    } else {
      for (int64_t r = r0; r < end; ++r) block_softmax(p, w, r, position(r), b * kKeys);
    }
    amx_group_values(p, w, r0, end, vblock);
  }
}

}  // namespace

}  // namespace radixlm_prefill
