// The work of one call of the paged decode kernel (paged_attention.cpp): its problem, the context splits, and
// the work items the threads share. Included by that file only; the namespace keeps these names to it.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kv_rows.h"

namespace radixlm_attention {

struct Problem {
  // [B, Hq, D], float32 or (when `bf16_io`) bfloat16: row (b, h) at query + b * query_stride_b + h * query_stride_h,
  // D contiguous.
  const void* query;
  void* out;  // [B, Hq, D] contiguous, in the query's dtype
  const int32_t* block_table;    // flat: the blocks of request b start at block_offsets[b]
  const int32_t* block_offsets;  // [B]
  const int32_t* context_lens;   // [B]
  int64_t query_stride_b, query_stride_h;
  int64_t num_heads, num_kv_heads, head_dim, block_size, sliding_window;
  float scale, softcap;
  // Rows whose context spans several splits (see kSplitPositions), or a shared part and a split, leave one partial
  // result per (record, query head) here, merged after all items (see num_records).
  float* partials;
  const int64_t* partial_offsets;
  // The step's new K/V rows (row b's at new_rows->slots[b]) when the kernel writes them, else null. A row that
  // `writes_own_row[b]` (see `plan_writes`) is written by the work items that attend its last split, each its own KV
  // heads, before they attend the slot; the others are written before any item starts.
  const radixlm_kv::NewRows* new_rows;
  const uint8_t* writes_own_row;
  // An int8 cache's scales (kv_rows.h); null for float32 and bfloat16 caches.
  radixlm_kv::Scales scales;
  bool bf16_io;  // query and output in bfloat16 (over a bfloat16 cache: attention_tiles_dot.h)
  // [B] positions at the start of each row's context attended with other rows' (decode_cascade.h), or null.
  const int32_t* shared_lens = nullptr;
};

// out[offset + e] = values[e] * multiplier for e < d, rounded to bfloat16 when the output is.
inline void store_output(const Problem& p, int64_t offset, const float* values, float multiplier, int64_t d) {
  if (p.bf16_io) {
    at::BFloat16* out = static_cast<at::BFloat16*>(p.out) + offset;
    for (int64_t e = 0; e < d; ++e) out[e] = c10::BFloat16(values[e] * multiplier);
    return;
  }
  float* out = static_cast<float*>(p.out) + offset;
#pragma omp simd
  for (int64_t e = 0; e < d; ++e) out[e] = values[e] * multiplier;
}

// A row's context is attended in splits of this many positions, cut at absolute positions (0, 512, ...), each a work
// item of its own, and the splits' partial softmax results are merged in order. A long context then keeps both
// threads busy even for one request (its KV heads alone are too few items). The last split runs to the end of the
// context, taking in a remainder shorter than half a split: an item of a few positions cost about as much as a full
// one, its read too short to stream (64 requests of 1,040 positions took 80 ms a step against 73 for 1,024). The cuts
// depend on the row's own length only, never on the batch, so a row gets the same numbers in any step (but for the
// shared part of a bfloat16 row that decode_cascade.h attends with other rows').
constexpr int64_t kSplitPositions = 512;

// The first position the row's context may attend: its sliding window's start, 0 without one.
inline int64_t window_start(const Problem& p, int64_t b) {
  return p.sliding_window > 0 ? std::max<int64_t>(0, p.context_lens[b] - p.sliding_window) : 0;
}

// Positions [0, shared_len) of row b were attended with other rows' (decode_cascade.h); its own items start after.
inline int64_t shared_len(const Problem& p, int64_t b) { return p.shared_lens != nullptr ? p.shared_lens[b] : 0; }

// The first position row b's own items attend.
inline int64_t first_position(const Problem& p, int64_t b) { return std::max(window_start(p, b), shared_len(p, b)); }

// Splits [first, last] of row b: an empty context has one (split 0, with nothing in it).
inline int64_t first_split(const Problem& p, int64_t b) { return first_position(p, b) / kSplitPositions; }

inline int64_t last_split(const Problem& p, int64_t b) {
  const int64_t context_len = p.context_lens[b];
  const int64_t last = std::max<int64_t>(context_len - 1, 0) / kSplitPositions;
  const bool short_remainder = context_len - last * kSplitPositions < kSplitPositions / 2;
  return last > first_split(p, b) && short_remainder ? last - 1 : last;
}

inline int64_t num_splits(const Problem& p, int64_t b) { return last_split(p, b) - first_split(p, b) + 1; }

// One past the last position of split `split` of row b.
inline int64_t split_end(const Problem& p, int64_t b, int64_t split) {
  return split >= last_split(p, b) ? p.context_lens[b] : (split + 1) * kSplitPositions;
}

// Partial records of row b (its splits', and the shared part's first when it has one): 0 when its one split writes
// its output directly. Record k of query head h is at partials + (partial_offsets[b] + k * num_heads + h) * (D + 2).
inline int64_t num_records(const Problem& p, int64_t b) {
  const int64_t count = num_splits(p, b) + (shared_len(p, b) > 0 ? 1 : 0);
  return count > 1 ? count : 0;
}

// The record that split `split` of row b fills.
inline int64_t split_record(const Problem& p, int64_t b, int64_t split) {
  return split - first_split(p, b) + (shared_len(p, b) > 0 ? 1 : 0);
}

// offsets[i] = element offset in the caches of the K/V row of position `from + i`, KV head h0, for i < count (the
// request's blocks at `blocks`): the block table walked with one division per call, not one per position.
inline void row_offsets(const Problem& p, const int32_t* blocks, int64_t h0, int64_t from, int64_t count,
                        int64_t* offsets) {
  const int64_t row_stride = p.num_kv_heads * p.head_dim;
  int64_t block = from / p.block_size, within = from - block * p.block_size;
  for (int64_t i = 0; i < count; ++i) {
    offsets[i] = (static_cast<int64_t>(blocks[block]) * p.block_size + within) * row_stride + h0 * p.head_dim;
    if (++within == p.block_size) {
      within = 0;
      ++block;
    }
  }
}

// K/V bytes a thread should read for waking it to pay off. Smaller steps (a request with a short context) run on the
// calling thread: no fork, and no waiting on a worker that a busy machine has descheduled, which measured up to
// milliseconds per call here. One request, bfloat16 cache, caches cold, 1 thread against 2 (Zen 4, 2026-12-05): 4
// query heads a KV head (Llama 3 shapes) 512 KB 54 / 38 us, 256 KB 30 / 30; 3 (the default model) 384 KB 35 / 31,
// 192 KB 22 / 22, 768 KB 69 / 47 (512 KB a thread kept all of these on one).
constexpr int64_t kMinBytesPerThread = 256 << 10;

struct Item {
  int64_t row, num_rows, h0, h1, split;
};

// Rows of one run a work item takes at most: a long run (a prefill chunk attending as decodes) is cut into pieces
// that each read the context again, from cache, so that an item's queries and accumulators stay small.
constexpr int64_t kMaxRowsPerPiece = 64;

// Whether row b continues the run of rows before it (see `plan_items`).
inline bool continues_run(const Problem& p, int64_t b) {
  return b > 0 && p.sliding_window <= 0 && p.block_offsets[b] == p.block_offsets[b - 1] &&
         p.context_lens[b] >= p.context_lens[b - 1] && shared_len(p, b) == 0 && shared_len(p, b - 1) == 0 &&
         last_split(p, b) == last_split(p, b - 1);
}

// The work items of a step: runs of rows of one request (consecutive rows with the same block offset, non-decreasing
// lengths and the same last split: a decode verifying drafts, or a prefill chunk; never with a sliding window, whose
// rows start at different positions), cut into pieces of at most kMaxRowsPerPiece rows, times KV heads. An item reads
// each position's K/V rows of all heads, one contiguous run of memory; with too few pieces to keep every thread
// busy, items take one KV head, and pieces are cut smaller (each piece reads the context again, from cache). A
// single thread keeps whole rows, which it streams in (attention_stream_in.h).
std::vector<Item> plan_items(const Problem& p, int64_t batch, int64_t num_threads) {
  std::vector<int64_t> run_starts;
  for (int64_t b = 0; b < batch; ++b) {
    if (!continues_run(p, b)) run_starts.push_back(b);
  }
  const int64_t num_runs = static_cast<int64_t>(run_starts.size());
  run_starts.push_back(batch);
  const auto count_pieces = [&](int64_t cap) {
    int64_t count = 0;
    for (int64_t k = 0; k < num_runs; ++k) count += (run_starts[k + 1] - run_starts[k] + cap - 1) / cap;
    return count;
  };
  const int64_t target = 4 * num_threads;
  int64_t rows_per_piece = kMaxRowsPerPiece;
  const int64_t num_pieces = count_pieces(rows_per_piece);
  const int64_t heads_per_item = num_pieces >= target || num_threads == 1 ? p.num_kv_heads : 1;
  const int64_t items_per_row = p.num_kv_heads / heads_per_item;
  if (num_threads > 1 && num_pieces * items_per_row < target) {  // enough pieces for `target` items
    rows_per_piece = std::clamp<int64_t>((batch * items_per_row + target - 1) / target, 1, kMaxRowsPerPiece);
  }
  std::vector<Item> items;
  for (int64_t k = 0; k < num_runs; ++k) {
    const int64_t first = run_starts[k], num_rows = run_starts[k + 1] - first;
    const int64_t pieces = (num_rows + rows_per_piece - 1) / rows_per_piece;
    for (int64_t piece = 0, row = first; piece < pieces; ++piece) {
      const int64_t size = num_rows / pieces + (piece < num_rows % pieces ? 1 : 0);
      const int64_t longest = row + size - 1;  // the row with the longest context
      for (int64_t split = first_split(p, longest); split <= last_split(p, longest); ++split) {
        for (int64_t h0 = 0; h0 < p.num_kv_heads; h0 += heads_per_item) {
          items.push_back({row, size, h0, h0 + heads_per_item, split});
        }
      }
      row += size;
    }
  }
  return items;
}

// Which rows the work items write themselves (Problem::writes_own_row): a row whose slot is its context's last
// position, in a block that no other row reads (in the engine: a plain decode; the rows of a chunk or of a
// verification read each other's new positions). Those writes need no ordering: only the row's own items read that
// block, and they write before they attend it. Block ids are below `num_blocks` (the op checks the tables).
inline std::vector<uint8_t> plan_writes(const Problem& p, int64_t batch, int64_t num_blocks) {
  std::vector<uint64_t> candidate((num_blocks + 63) / 64), shared((num_blocks + 63) / 64);
  const auto has = [](const std::vector<uint64_t>& bits, int64_t k) { return (bits[k >> 6] >> (k & 63)) & 1; };
  const auto mark = [](std::vector<uint64_t>& bits, int64_t k) { bits[k >> 6] |= uint64_t{1} << (k & 63); };
  std::vector<int64_t> own_block(batch, -1);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = p.context_lens[b];
    if (len == 0) continue;
    const int64_t last = len - 1, block = p.block_table[p.block_offsets[b] + last / p.block_size];
    if (p.new_rows->slots[b] != block * p.block_size + last % p.block_size) continue;
    own_block[b] = block;
    mark(has(candidate, block) ? shared : candidate, block);
  }
  // Every block some row reads, once per run of rows with one table offset (the rows of one request): a candidate's
  // block read by any row but its owner alone is shared.
  for (int64_t b = 0, e = 0; b < batch; b = e) {
    int64_t first = 0, last = -1;  // block indexes the run reads
    for (e = b; e < batch && p.block_offsets[e] == p.block_offsets[b]; ++e) {
      if (p.context_lens[e] == 0) continue;
      const int64_t lo = window_start(p, e) / p.block_size;  // the shared part too: it reads after these writes
      first = last < 0 ? lo : std::min(first, lo);
      last = std::max<int64_t>(last, (p.context_lens[e] - 1) / p.block_size);
    }
    const int32_t* table = p.block_table + p.block_offsets[b];
    for (int64_t k = first; k <= last; ++k) {
      const bool owners_own = e - b == 1 && table[k] == own_block[b];
      if (has(candidate, table[k]) && !owners_own) mark(shared, table[k]);
    }
  }
  std::vector<uint8_t> owns(batch, 0);
  for (int64_t b = 0; b < batch; ++b) owns[b] = own_block[b] >= 0 && !has(shared, own_block[b]);
  return owns;
}

}  // namespace radixlm_attention
