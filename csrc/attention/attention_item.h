// One work item of the paged decode kernel (paged_attention.cpp): a request's rows over one split of their
// context, for some or all KV heads: its state, the tile step (scores, softmax, values) and the item's loop over
// tiles with its stream-in and its own K/V write. Included by that file only; the namespace keeps these names to it.

#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attention_generic.h"
#include "attention_plan.h"
#include "attention_softmax.h"
#include "attention_stream_in.h"
#include "attention_tiles.h"
#include "attention_tiles_dot.h"
#include "isa.h"
#include "kv_rows.h"

namespace radixlm_attention {

// One work item's state: its query rows gathered, and per query head j (row r's head jj is j = r * per_row + jj)
// the running output, scores of the current tile, running max and running sum, all in `scratch`.
struct ItemState {
  int64_t b, num_rows, h0, num_kv, rep, per_row, d;
  float *q, *acc, *scores, *running_max, *running_sum;

  ItemState(const Problem& p, int64_t b_, int64_t num_rows_, int64_t h0_, int64_t h1, std::vector<float>& scratch)
      : b(b_), num_rows(num_rows_), h0(h0_), num_kv(h1 - h0_), rep(p.num_heads / p.num_kv_heads),
        per_row(num_kv * rep), d(p.head_dim) {
    const int64_t num_q = num_rows * per_row;
    scratch.resize(2 * num_q * d + num_q * kTile + 2 * num_q);
    q = scratch.data();                  // [num_q, D]: gathered from a strided query
    acc = q + num_q * d;                 // [num_q, D]
    scores = acc + num_q * d;            // [num_q, kTile]
    running_max = scores + num_q * kTile;
    running_sum = running_max + num_q;
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t jj = 0; jj < per_row; ++jj) {
        const int64_t offset = (b + r) * p.query_stride_b + (h0 * rep + jj) * p.query_stride_h;
        float* row = q + (r * per_row + jj) * d;
        if (p.bf16_io) {
          const at::BFloat16* query = static_cast<const at::BFloat16*>(p.query) + offset;
          for (int64_t e = 0; e < d; ++e) row[e] = static_cast<float>(query[e]);
        } else {
          std::copy_n(static_cast<const float*>(p.query) + offset, d, row);
        }
      }
    }
    std::fill(acc, acc + num_q * d, 0.f);
    // A finite floor, not -inf: the first tile's correction is then exp(very negative) = ~0, never exp(nan).
    std::fill(running_max, running_max + num_q, -1e30f);
    std::fill(running_sum, running_sum + num_q, 0.f);
  }
};

// For an int8 cache: multiplies row r's scores (or, after the softmax, its weights) of each KV head h of the item by
// the tile's per-position scales of that head, `scales` being the keys' (or the values'). The dot products ran on the
// int8 values as they are, so this is the whole dequantization: q . (k * s) = (q . k) * s, and likewise
// sum_i w_i (v_i * s_i) = sum_i (w_i * s_i) v_i. The running sum has already taken the unscaled weights.
template <int64_t kD>
void scale_tile(const ItemState& s, const at::Half* scales, int64_t r, const int64_t* rows, int64_t n) {
  const int64_t d = kD > 0 ? kD : s.d;
  float row_scale[kTile];
  for (int64_t h = 0; h < s.num_kv; ++h) {
    // rows[i] is the element offset of (slot, KV head h0): divided by D, the scale's index for head h0.
    for (int64_t i = 0; i < n; ++i) row_scale[i] = radixlm_kv::scale_value(scales[rows[i] / d + h]);
    for (int64_t j = r * s.per_row + h * s.rep; j < r * s.per_row + (h + 1) * s.rep; ++j) {
      float* weights = s.scores + j * kTile;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) weights[i] *= row_scale[i];
    }
  }
}

// Row r's softmax step over a tile of n scored positions, for each of its query heads.
inline void softmax_rows(const Problem& p, ItemState& s, int64_t r, int64_t n) {
  const int64_t per_row = s.per_row, d = s.d;
#if RADIXLM_BUILD_AVX512
  if (d % 16 == 0) {
    if (p.softcap > 0.f) {
      for (int64_t j = r * per_row; j < (r + 1) * per_row; ++j) soft_cap(s.scores + j * kTile, n, p.softcap);
    }
    for (int64_t j = r * per_row; j < (r + 1) * per_row; j += 16) {
      softmax_heads(s.scores + j * kTile, n, std::min<int64_t>(16, (r + 1) * per_row - j), s.running_max + j,
                    s.running_sum + j, s.acc + j * d, d);
    }
    return;
  }
#endif
  for (int64_t j = r * per_row; j < (r + 1) * per_row; ++j) {
    softmax_tile(s.scores + j * kTile, n, p.softcap, s.running_max[j], s.running_sum[j], s.acc + j * d, d);
  }
}

// Runs `phase(group, h, j0, num_next)` over row r's query heads, KV head by KV head in register groups (for_groups);
// only each KV head's first group prefetches the next tile's rows (the others find them in cache).
template <int64_t kC, typename Phase>
inline void for_head_groups(const ItemState& s, int64_t r, int64_t num_next, Phase&& phase) {
  for (int64_t h = 0; h < s.num_kv; ++h) {
    const int64_t first = r * s.per_row + h * s.rep;
    for_groups<kC>(first, first + s.rep, [&](auto group, int64_t j0) {
      phase(group, h, j0, j0 == first ? num_next : 0);
    });
  }
}

// Row r's positions of one tile (K/V rows at element offsets `rows`, of KV head h0): scores, softmax, values. `next`
// holds the offsets of the `num_next` rows the phases prefetch as they go (none when the tile is already in cache).
// A bfloat16 query over a bfloat16 cache takes the dot-product phases where the build has them.
template <typename scalar_t, int64_t kD>
void attend_tile(const Problem& p, ItemState& s, const scalar_t* keys, const scalar_t* values, int64_t r,
                 const int64_t* rows, int64_t n, const int64_t* next, int64_t num_next) {
  const int64_t per_row = s.per_row, rep = s.rep, d = kD > 0 ? kD : s.d;
  constexpr int64_t kC = kD / 16;
#if RADIXLM_BUILD_AVX512_BF16
  if constexpr (kDotTiles<scalar_t, kD>) {
    if (p.bf16_io) {
      for_head_groups<kC>(s, r, num_next, [&](auto group, int64_t h, int64_t j0, int64_t ahead) {
        score_group_dot<kC, decltype(group)::value>(s.q, keys, rows, n, h, j0, p.scale, s.scores, next, ahead);
      });
      softmax_rows(p, s, r, n);
      for_head_groups<kC>(s, r, num_next, [&](auto group, int64_t h, int64_t j0, int64_t ahead) {
        value_group_dot<kC, decltype(group)::value>(s.acc, values, rows, n, h, j0, s.scores, next, ahead);
      });
      return;
    }
  }
#endif
  if constexpr (kD > 0 && kD % 16 == 0) {
    for_head_groups<kC>(s, r, num_next, [&](auto group, int64_t h, int64_t j0, int64_t ahead) {
      score_group<scalar_t, kC, decltype(group)::value>(s.q, keys, rows, n, h, j0, p.scale, s.scores, next, ahead);
    });
  } else {
    score_tile(s.q + r * per_row * d, keys, rows, n, s.num_kv, rep, d, p.scale, s.scores + r * per_row * kTile);
  }
  if constexpr (std::is_same_v<scalar_t, int8_t>) scale_tile<kD>(s, p.scales.keys, r, rows, n);
  softmax_rows(p, s, r, n);
  if constexpr (std::is_same_v<scalar_t, int8_t>) scale_tile<kD>(s, p.scales.values, r, rows, n);
  if constexpr (kD > 0 && kD % 16 == 0) {
    for_head_groups<kC>(s, r, num_next, [&](auto group, int64_t h, int64_t j0, int64_t ahead) {
      value_group<scalar_t, kC, decltype(group)::value>(s.acc, values, rows, n, h, j0, s.scores, next, ahead);
    });
  } else {
    value_tile(s.acc + r * per_row * d, values, rows, n, s.num_kv, rep, d, s.scores + r * per_row * kTile);
  }
}

// Each row's result for this split: its output when the split is its whole context, else a partial record.
void store_results(const Problem& p, const ItemState& s, int64_t split) {
  const int64_t d = s.d;
  for (int64_t r = 0; r < s.num_rows; ++r) {
    const int64_t row = s.b + r;
    if (split > last_split(p, row)) continue;  // a safeguard: rows of a group share their last split
    if (num_records(p, row) > 0) {  // a partial result: (max, sum, unnormalised output) per query head
      float* record = p.partials + (p.partial_offsets[row] + split_record(p, row, split) * p.num_heads +
                                    s.h0 * s.rep) * (d + 2);
      for (int64_t jj = 0; jj < s.per_row; ++jj, record += d + 2) {
        const int64_t j = r * s.per_row + jj;
        record[0] = s.running_max[j];
        record[1] = s.running_sum[j];
        std::copy_n(s.acc + j * d, d, record + 2);
      }
      continue;
    }
    const int64_t out_offset = (row * p.num_heads + s.h0 * s.rep) * d;
    for (int64_t jj = 0; jj < s.per_row; ++jj) {
      const int64_t j = r * s.per_row + jj;
      const float inverse = s.running_sum[j] > 0.f ? 1.f / s.running_sum[j] : 0.f;  // empty context: zeros
      store_output(p, out_offset + jj * d, s.acc + j * d, inverse, d);
    }
  }
}

// Attention of `num_rows` consecutive query rows b, b + 1, ... of one request (one row for a plain decode; a row per
// position for a decode verifying drafts) over their contexts, for the query heads that read KV heads [h0, h1):
// query head `jj` of the item (global head h0 * rep + jj) reads KV head h0 + jj / rep. The rows share their blocks
// and their context lengths do not decrease, so each tile of K/V rows comes from memory once for all of them (and
// for the `rep` query heads of each KV head); every row gets exactly the numbers it gets alone: the same tiles, in
// the same order, each row stopping at its own length. kD > 0 fixes head_dim at compile time; 0 reads it from the
// problem. The loops over query heads keep a runtime trip count on purpose: with everything constant, GCC
// vectorises across rows with gathers, which is far slower.
template <typename scalar_t, int64_t kD>
void attend_rows(const Problem& p, scalar_t* keys, scalar_t* values, int64_t b, int64_t num_rows, int64_t h0,
                 int64_t h1, int64_t split, bool stagger, std::vector<float>& scratch) {
  ItemState s(p, b, num_rows, h0, h1, scratch);
  const int64_t longest = b + num_rows - 1, context_len = p.context_lens[longest];
  // Whether this item writes the row's new K/V (see Problem::writes_own_row): an item that streams writes them
  // right after streaming in the last chunk, which holds them, so the stores hit lines already in cache; one that
  // does not stream writes them first.
  const bool writes_row = p.writes_own_row != nullptr && p.writes_own_row[b] && split == last_split(p, longest);
  // Rows are grouped only without a sliding window and with the same last split (see `plan_items`), so `first` is
  // each row's own start and `end` each row's own split end or length. This item attends [first, end) of the split.
  const int64_t first = std::max(first_position(p, longest), split * kSplitPositions);
  const int64_t end = split_end(p, longest, split);
  const int32_t* blocks = p.block_table + p.block_offsets[b];
  // An item with every KV head streams its K/V in chunk by chunk (attention_stream_in.h); one with some heads reads
  // a strided part of each row, and prefetches each tile's rows one tile ahead instead, as it goes. A staggered
  // item's first chunk is half a chunk long (see `run`); chunks never change the numbers, only when bytes are read.
  const bool whole_rows = s.num_kv == p.num_kv_heads;
  const int64_t chunk = stream_in_positions(p.num_kv_heads * p.head_dim * static_cast<int64_t>(sizeof(scalar_t)));
  const int64_t lead = stagger ? std::max<int64_t>(kTile, chunk / 2 / kTile * kTile) : chunk;
  int64_t offsets[kTile], next[kTile];  // element offsets of this tile's K/V rows (KV head h0) and the next's
  if (writes_row && !whole_rows) {
    radixlm_kv::write_row(keys, values, p.scales, *p.new_rows, b, h0, h1, p.num_kv_heads, p.head_dim);
  }
  int64_t streamed = first;  // positions before this are in cache
  for (int64_t start = first; start < end; start += kTile) {
    const int64_t n = std::min(kTile, end - start);
    if (whole_rows && start >= streamed) {
      streamed = std::min(end, start + (start == first ? lead : chunk));
      if (end - streamed < chunk / 4) streamed = end;  // a short remainder streams with this chunk
      stream_in(p, blocks, keys, values, start, streamed);
      if (writes_row && streamed == end) {
        radixlm_kv::write_row(keys, values, p.scales, *p.new_rows, b, h0, h1, p.num_kv_heads, p.head_dim);
      }
    }
    row_offsets(p, blocks, h0, start, n, offsets);
    const int64_t num_next = whole_rows ? 0 : std::clamp<int64_t>(context_len - start - kTile, 0, kTile);
    row_offsets(p, blocks, h0, start + kTile, num_next, next);
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t n_row = std::min(n, p.context_lens[b + r] - start);  // this row's positions in the tile
      // The first row's phases prefetch the next tile; the others read this tile again, from cache.
      if (n_row > 0) {
        attend_tile<scalar_t, kD>(p, s, keys, values, r, offsets, n_row, next, r == 0 ? num_next : 0);
      }
    }
  }
  store_results(p, s, split);
}

}  // namespace radixlm_attention
