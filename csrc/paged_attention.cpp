// Paged decode attention on CPU: one call per layer for every decoding request.
//
// Each query row (a decode, or one position of a decode verifying drafts) reads its context in place through its
// block table (slot = block * block_size + offset), so shared prefixes and scattered blocks cost nothing extra.
// Work items are a request's rows (all KV heads: one contiguous run of memory per position), or (rows, KV head)
// pairs when there are too few requests for the threads, spread over OpenMP threads; each K/V row is read once for
// all the query heads and rows that share it (GQA, verification) and the softmax is computed online in one pass
// over the context, tile by tile; contexts longer than kSplitPositions are cut at fixed positions into splits of
// their own, merged after. Storage may be float32 or bfloat16; arithmetic is float32. The inner loops are plain C++
// (GCC vector types and AVX-512 where the host has it) that -O3 vectorises.
//
// attention_plan.h holds the problem and its work items, attention_stream_in.h the read that brings a chunk of K/V
// into cache before it is attended, attention_softmax.h the softmax phase and the merge of splits, attention_tiles.h
// the register-tiled score and value phases (head_dim 64 and 128), attention_generic.h those of any other head_dim.

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "attention_generic.h"
#include "attention_plan.h"
#include "attention_softmax.h"
#include "attention_stream_in.h"
#include "attention_tiles.h"

namespace {

using namespace radixlm_attention;  // the plan, the stream-in, the softmax, the tile phases and kTile

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
        std::copy_n(p.query + (b + r) * p.query_stride_b + (h0 * rep + jj) * p.query_stride_h, d,
                    q + (r * per_row + jj) * d);
      }
    }
    std::fill(acc, acc + num_q * d, 0.f);
    // A finite floor, not -inf: the first tile's correction is then exp(very negative) = ~0, never exp(nan).
    std::fill(running_max, running_max + num_q, -1e30f);
    std::fill(running_sum, running_sum + num_q, 0.f);
  }
};

// Row r's positions of one tile (K/V rows at element offsets `rows`, of KV head h0): scores, softmax, values. `next`
// holds the offsets of the `num_next` rows the phases prefetch as they go (none when the tile is already in cache).
template <typename scalar_t, int64_t kD>
void attend_tile(const Problem& p, ItemState& s, const scalar_t* keys, const scalar_t* values, int64_t r,
                 const int64_t* rows, int64_t n, const int64_t* next, int64_t num_next) {
  const int64_t per_row = s.per_row, rep = s.rep, d = kD > 0 ? kD : s.d;
  if constexpr (kD > 0 && kD % 16 == 0) {
    constexpr int64_t kC = kD / 16;
    for (int64_t h = 0; h < s.num_kv; ++h) {
      for_groups<kC>(r * per_row + h * rep, r * per_row + (h + 1) * rep, [&](auto group, int64_t j0) {
        score_group<scalar_t, kC, decltype(group)::value>(s.q, keys, rows, n, h, j0, p.scale, s.scores, next,
                                                          j0 == r * per_row + h * rep ? num_next : 0);
      });
    }
  } else {
    score_tile(s.q + r * per_row * d, keys, rows, n, s.num_kv, rep, d, p.scale, s.scores + r * per_row * kTile);
  }
#if defined(__AVX512F__)
  if (p.softcap <= 0.f && d % 16 == 0) {
    for (int64_t j = r * per_row; j < (r + 1) * per_row; j += 16) {
      softmax_heads(s.scores + j * kTile, n, std::min<int64_t>(16, (r + 1) * per_row - j), s.running_max + j,
                    s.running_sum + j, s.acc + j * d, d);
    }
  } else
#endif
  for (int64_t j = r * per_row; j < (r + 1) * per_row; ++j) {
    softmax_tile(s.scores + j * kTile, n, p.softcap, s.running_max[j], s.running_sum[j], s.acc + j * d, d);
  }
  if constexpr (kD > 0 && kD % 16 == 0) {
    constexpr int64_t kC = kD / 16;
    for (int64_t h = 0; h < s.num_kv; ++h) {
      for_groups<kC>(r * per_row + h * rep, r * per_row + (h + 1) * rep, [&](auto group, int64_t j0) {
        value_group<scalar_t, kC, decltype(group)::value>(s.acc, values, rows, n, h, j0, s.scores, next,
                                                          j0 == r * per_row + h * rep ? num_next : 0);
      });
    }
  } else {
    value_tile(s.acc + r * per_row * d, values, rows, n, s.num_kv, rep, d, s.scores + r * per_row * kTile);
  }
}

// Each row's result for this split: its output when the split is its whole context, else a partial record.
void write_rows(const Problem& p, const ItemState& s, int64_t split) {
  const int64_t d = s.d;
  for (int64_t r = 0; r < s.num_rows; ++r) {
    const int64_t row_len = p.context_lens[s.b + r];
    if (split > last_split(p, row_len)) continue;  // a safeguard: rows of a group share their last split
    if (num_splits(p, row_len) > 1) {  // a partial result: (max, sum, unnormalised output) per query head
      float* record = p.partials + (p.partial_offsets[s.b + r] + (split - first_split(p, row_len)) * p.num_heads +
                                    s.h0 * s.rep) * (d + 2);
      for (int64_t jj = 0; jj < s.per_row; ++jj, record += d + 2) {
        const int64_t j = r * s.per_row + jj;
        record[0] = s.running_max[j];
        record[1] = s.running_sum[j];
        std::copy_n(s.acc + j * d, d, record + 2);
      }
      continue;
    }
    float* out = p.out + ((s.b + r) * p.num_heads + s.h0 * s.rep) * d;
    for (int64_t jj = 0; jj < s.per_row; ++jj) {
      const int64_t j = r * s.per_row + jj;
      const float inverse = s.running_sum[j] > 0.f ? 1.f / s.running_sum[j] : 0.f;  // empty context: zeros
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) out[jj * d + e] = s.acc[j * d + e] * inverse;
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
  const int64_t context_len = p.context_lens[b + num_rows - 1];  // the longest row's
  // The row's new K/V, when this item writes them (see Problem::writes_own_row): an item that streams writes them
  // right after streaming in the chunk that holds them, so the stores hit lines already in cache; one that does not
  // stream writes them first.
  bool write_pending = p.writes_own_row != nullptr && p.writes_own_row[b] && split == last_split(p, context_len);
  const auto write_own_row = [&] {
    radixlm_kv::write_row(keys, values, *p.new_rows, b, h0, h1, p.num_kv_heads, p.head_dim);
    write_pending = false;
  };
  // Rows are grouped only without a sliding window and with the same last split (see `plan_items`), so `first` is
  // each row's own start and `end` each row's own split end or length. This item attends [first, end) of the split.
  const int64_t first = std::max(first_position(p, context_len), split * kSplitPositions);
  const int64_t end = split_end(p, context_len, split);
  const int32_t* blocks = p.block_table + p.block_offsets[b];
  // An item with every KV head streams its K/V in chunk by chunk (attention_stream_in.h); one with some heads reads
  // a strided part of each row, and prefetches each tile's rows one tile ahead instead, as it goes. A staggered
  // item's first chunk is half a chunk long (see `run`); chunks never change the numbers, only when bytes are read.
  const bool whole_rows = s.num_kv == p.num_kv_heads;
  const int64_t chunk = stream_in_positions(p.num_kv_heads * p.head_dim * static_cast<int64_t>(sizeof(scalar_t)));
  const int64_t lead = stagger ? std::max<int64_t>(kTile, chunk / 2 / kTile * kTile) : chunk;
  int64_t offsets[kTile], next[kTile];  // element offsets of this tile's K/V rows (KV head h0) and the next's
  int64_t streamed = first;  // positions before this are in cache
  for (int64_t start = first; start < end; start += kTile) {
    const int64_t n = std::min(kTile, end - start);
    if (whole_rows && start >= streamed) {
      streamed = std::min(end, start + (start == first ? lead : chunk));
      if (end - streamed < chunk / 4) streamed = end;  // a short remainder streams with this chunk
      stream_in(p, blocks, keys, values, start, streamed);
      if (write_pending && streamed == end) write_own_row();
    }
    if (write_pending && !whole_rows) write_own_row();
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
  write_rows(p, s, split);
}

// Which rows the items write themselves (see Problem::writes_own_row): a row alone in its run whose slot is its
// context's last position. The rest are listed in `prewritten`.
std::vector<uint8_t> plan_writes(const Problem& p, int64_t batch, std::vector<int64_t>& prewritten) {
  std::vector<uint8_t> own(batch, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = p.context_lens[b];
    bool alone = len > 0 && !continues_run(p, b) && !(b + 1 < batch && continues_run(p, b + 1));
    if (alone) {
      const int64_t last = len - 1, block = p.block_table[p.block_offsets[b] + last / p.block_size];
      alone = p.new_rows->slots[b] == block * p.block_size + last % p.block_size;
    }
    own[b] = alone;
    if (!alone) prewritten.push_back(b);
  }
  return own;
}

template <typename scalar_t, int64_t kD>
void run(Problem p, scalar_t* keys, scalar_t* values, int64_t batch) {
  int64_t num_positions = 0;
  std::vector<int64_t> partial_offsets(batch), merged_rows;
  int64_t num_records = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = p.context_lens[b];
    num_positions += len - first_position(p, len);
    partial_offsets[b] = num_records;
    if (num_splits(p, len) > 1) {
      num_records += num_splits(p, len) * p.num_heads;
      merged_rows.push_back(b);
    }
  }
  // Not zeroed: the merge reads only records that an item wrote.
  const std::unique_ptr<float[]> partials(new float[num_records * (p.head_dim + 2)]);
  p.partials = partials.get();
  p.partial_offsets = partial_offsets.data();
  const int64_t num_bytes = 2 * num_positions * p.num_kv_heads * p.head_dim * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t num_threads =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_bytes / kMinBytesPerThread));
  const std::vector<Item> items = plan_items(p, batch, num_threads);
  const int64_t num_items = static_cast<int64_t>(items.size()), num_merged = static_cast<int64_t>(merged_rows.size());
  std::vector<int64_t> prewritten;
  std::vector<uint8_t> writes_own_row;
  if (p.new_rows != nullptr) {
    writes_own_row = plan_writes(p, batch, prewritten);
    p.writes_own_row = writes_own_row.data();
  }
  const int64_t num_prewritten = static_cast<int64_t>(prewritten.size());
  // Dynamic scheduling: contexts differ in length, so equal static shares would leave a thread idle.
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
  {
    std::vector<float> scratch;
    // Every other thread staggers its first item, so that the threads' streaming and arithmetic alternate rather
    // than coincide: while one computes from cache, the other has the memory to itself. Items of equal size keep the
    // offset. 64 x 256 positions: 1.06-1.10x -> 1.03-1.06x the read of the same bytes; 64 x 1,024: 1.22x -> 1.14x.
    bool stagger = omp_get_thread_num() % 2 == 1;
    if (num_prewritten > 0) {  // rows other items may read: all written before any item starts (the barrier)
#pragma omp for schedule(static)
      for (int64_t k = 0; k < num_prewritten; ++k) {
        radixlm_kv::write_row(keys, values, *p.new_rows, prewritten[k], 0, p.num_kv_heads, p.num_kv_heads,
                              p.head_dim);
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < num_items; ++k) {
      const Item& item = items[k];
      attend_rows<scalar_t, kD>(p, keys, values, item.row, item.num_rows, item.h0, item.h1, item.split, stagger,
                                scratch);
      stagger = false;
    }
#pragma omp for schedule(static)
    for (int64_t k = 0; k < num_merged; ++k) merge_splits(p, merged_rows[k]);
  }
}

template <typename scalar_t>
void dispatch_head_dim(const Problem& p, at::Tensor& key_cache, at::Tensor& value_cache, int64_t batch) {
  scalar_t* keys = key_cache.data_ptr<scalar_t>();
  scalar_t* values = value_cache.data_ptr<scalar_t>();
  if (p.head_dim == 64) {
    run<scalar_t, 64>(p, keys, values, batch);
  } else if (p.head_dim == 128) {
    run<scalar_t, 128>(p, keys, values, batch);
  } else {
    run<scalar_t, 0>(p, keys, values, batch);
  }
}

// Every block a request reads must exist: a bad table would read outside the caches. O(blocks), negligible next
// to the attention itself.
void check_tables(const at::Tensor& block_table, const at::Tensor& block_offsets, const at::Tensor& context_lens,
                  int64_t block_size, int64_t num_blocks) {
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int32_t* offsets = block_offsets.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  const int64_t table_len = block_table.size(0);
  for (int64_t b = 0; b < context_lens.size(0); ++b) {
    const int64_t needed = (static_cast<int64_t>(lens[b]) + block_size - 1) / block_size;
    TORCH_CHECK(lens[b] >= 0 && offsets[b] >= 0 && offsets[b] + needed <= table_len, "request ", b,
                ": its context needs ", needed, " blocks from offset ", offsets[b], " of a table of ", table_len);
    for (int64_t i = offsets[b]; i < offsets[b] + needed; ++i) {
      TORCH_CHECK(table[i] >= 0 && table[i] < num_blocks, "block id ", table[i], " outside the cache's ", num_blocks,
                  " blocks");
    }
  }
}

// With slot_mapping, new_keys and new_values (all or none), the op first writes each row's new K/V, as write_kv
// does, then attends: one call per layer instead of two when every row of a step decodes.
at::Tensor paged_decode_attention(const at::Tensor& query, at::Tensor key_cache, at::Tensor value_cache,
                                  const at::Tensor& block_table, const at::Tensor& block_offsets,
                                  const at::Tensor& context_lens, int64_t block_size, double scale,
                                  int64_t sliding_window, double softcap,
                                  const c10::optional<at::Tensor>& slot_mapping,
                                  const c10::optional<at::Tensor>& new_keys,
                                  const c10::optional<at::Tensor>& new_values) {
  TORCH_CHECK(query.dim() == 3 && query.scalar_type() == at::kFloat, "query must be float32 [B, Hq, D]");
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes(),
              "key/value caches must be [num_slots, Hkv, D] of one shape");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type() &&
                  (key_cache.scalar_type() == at::kFloat || key_cache.scalar_type() == at::kBFloat16),
              "key/value caches must both be float32 or both bfloat16");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "key/value caches must be contiguous");
  TORCH_CHECK(key_cache.size(2) == query.size(2), "head_dim of the query and the cache differ");
  TORCH_CHECK(query.size(2) > 0 && key_cache.size(1) > 0, "head_dim and the number of KV heads must be positive");
  const int64_t batch = query.size(0), num_heads = query.size(1), num_kv_heads = key_cache.size(1);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads");
  for (const at::Tensor* t : {&block_table, &block_offsets, &context_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kInt && t->dim() == 1 && t->is_contiguous(),
                "block_table, block_offsets and context_lens must be contiguous 1-D int32");
  }
  TORCH_CHECK(block_offsets.size(0) == batch && context_lens.size(0) == batch, "one offset and length per row");
  TORCH_CHECK(block_size > 0, "block_size must be positive");
  check_tables(block_table, block_offsets, context_lens, block_size, key_cache.size(0) / block_size);
  // Any strides but a contiguous last dimension: the kernel gathers each item's few query rows itself, so the
  // usual transposed view of the packed batch needs no copy here.
  const at::Tensor q = query.stride(2) == 1 ? query : query.contiguous();
  at::Tensor out = at::empty(q.sizes(), q.options());
  Problem p{q.data_ptr<float>(), out.data_ptr<float>(), block_table.data_ptr<int32_t>(),
            block_offsets.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(), q.stride(0), q.stride(1),
            num_heads, num_kv_heads, q.size(2), block_size, sliding_window, static_cast<float>(scale),
            static_cast<float>(softcap), nullptr, nullptr, nullptr, nullptr};
  radixlm_kv::NewRows rows{};
  TORCH_CHECK(slot_mapping.has_value() == new_keys.has_value() && new_keys.has_value() == new_values.has_value(),
              "slot_mapping, new_keys and new_values go together");
  if (slot_mapping.has_value()) {
    rows = radixlm_kv::check_new_rows(key_cache, value_cache, *slot_mapping, *new_keys, *new_values);
    TORCH_CHECK(slot_mapping->size(0) == batch, "one new K/V row per query row");
    p.new_rows = &rows;
  }
  if (key_cache.scalar_type() == at::kFloat) {
    dispatch_head_dim<float>(p, key_cache, value_cache, batch);
  } else {
    dispatch_head_dim<at::BFloat16>(p, key_cache, value_cache, batch);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(radixlm, m) {
  m.def("paged_decode_attention(Tensor query, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor block_table, "
        "Tensor block_offsets, Tensor context_lens, int block_size, float scale, int sliding_window, "
        "float softcap, Tensor? slot_mapping=None, Tensor? new_keys=None, Tensor? new_values=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
