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
// attention_plan.h holds the problem and its work items, attention_softmax.h the softmax phase and the merge of
// splits, attention_tiles.h the register-tiled score and value phases.

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

#include "attention_plan.h"
#include "attention_softmax.h"
#include "attention_tiles.h"

namespace {

using namespace radixlm_attention;  // the plan, the softmax, the register-tiled phases and kTile
constexpr int64_t kPrefetchTiles = 1;  // how far ahead the K/V rows are asked for

// Element e of a K/V row as float32. bfloat16 is the top half of a float32, so widening is a zero-extend and a
// shift, which the compiler fuses into the vectorised loops below (no widened copy of the row is written).
inline float load(const float* row, int64_t e) { return row[e]; }

inline float load(const at::BFloat16* row, int64_t e) {
  const uint32_t wide = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[e]) << 16;
  return std::bit_cast<float>(wide);
}

template <typename scalar_t>
inline float dot(const float* __restrict q, const scalar_t* __restrict k, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t e = 0; e < n; ++e) sum += q[e] * load(k, e);
  return sum;
}

template <typename scalar_t>
inline void add_scaled(float* __restrict acc, float weight, const scalar_t* __restrict v, int64_t n) {
#pragma omp simd
  for (int64_t e = 0; e < n; ++e) acc[e] += weight * load(v, e);
}

// scores[j, i] = scale * q_j . k_i for the `n` positions of a tile (element offsets `rows[i]` of KV head h0) and
// the item's query heads j, KV head h0 + j / rep. Rows outer, heads inner: a K row serves its `rep` heads from L1.
template <typename scalar_t>
inline void score_tile(const float* q, const scalar_t* keys, const int64_t* rows, int64_t n, int64_t num_kv,
                       int64_t rep, int64_t d, float scale, float* scores) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < num_kv; ++h) {
      const scalar_t* k = keys + rows[i] + h * d;
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t j = h * rep + r;
        scores[j * kTile + i] = dot(q + j * d, k, d) * scale;
      }
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
void attend_rows(const Problem& p, const scalar_t* keys, const scalar_t* values, int64_t b, int64_t num_rows,
                 int64_t h0, int64_t h1, int64_t split, std::vector<float>& scratch) {
  const int64_t rep = p.num_heads / p.num_kv_heads, d = kD > 0 ? kD : p.head_dim;
  const int64_t num_kv = h1 - h0, per_row = num_kv * rep, num_q = num_rows * per_row;
  const int64_t context_len = p.context_lens[b + num_rows - 1];  // the longest row's
  // Rows are grouped only without a sliding window (see `plan_items`), so `first` is each row's own start. This item
  // attends positions [first, end) of the split.
  const int64_t first = std::max(first_position(p, context_len), split * kSplitPositions);
  const int64_t end = std::min(context_len, (split + 1) * kSplitPositions);
  const int32_t* blocks = p.block_table + p.block_offsets[b];

  scratch.resize(2 * num_q * d + num_q * kTile + 2 * num_q);
  float* q = scratch.data();                 // [num_q, D]: the item's query rows, gathered from a strided query
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t jj = 0; jj < per_row; ++jj) {
      std::copy_n(p.query + (b + r) * p.query_stride_b + (h0 * rep + jj) * p.query_stride_h, d,
                  q + (r * per_row + jj) * d);
    }
  }
  float* acc = q + num_q * d;                // [num_q, D]
  float* scores = acc + num_q * d;           // [num_q, kTile]
  float* running_max = scores + num_q * kTile;  // [num_q]
  float* running_sum = running_max + num_q;  // [num_q]
  std::fill(acc, acc + num_q * d, 0.f);
  // A finite floor, not -inf: the first tile's correction is then exp(very negative) = ~0, never exp(nan).
  std::fill(running_max, running_max + num_q, -1e30f);
  std::fill(running_sum, running_sum + num_q, 0.f);
  const int64_t row_stride = p.num_kv_heads * d;
  int64_t offsets[kTile];  // element offset of each position's K (and V) row of KV head h0

  const auto offset_of = [&](int64_t pos) {
    const int64_t slot = static_cast<int64_t>(blocks[pos / p.block_size]) * p.block_size + pos % p.block_size;
    return slot * row_stride + h0 * d;
  };
  int64_t next[kTile];  // offsets of the tile kPrefetchTiles ahead, whose rows the phases below prefetch as they go
  const int64_t head_bytes = d * static_cast<int64_t>(sizeof(scalar_t));
  // The tiles before the first that the loop prefetches: ask for them now.
  for (int64_t pos = first + kTile; pos < std::min(first + kPrefetchTiles * kTile, context_len); ++pos) {
    for (int64_t h = 0; h < num_kv; ++h) {
      for (int64_t line = 0; line < head_bytes; line += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(keys + offset_of(pos) + h * d) + line, 0, 2);
        __builtin_prefetch(reinterpret_cast<const char*>(values + offset_of(pos) + h * d) + line, 0, 2);
      }
    }
  }
  for (int64_t start = first; start < end; start += kTile) {
    const int64_t n = std::min(kTile, end - start);
    for (int64_t i = 0; i < n; ++i) offsets[i] = offset_of(start + i);
    // The rows of a tile jump between blocks and heads, which the hardware prefetchers follow poorly: each phase
    // asks for the rows of its head kPrefetchTiles tiles ahead, one per position it processes, so the requests
    // are spread out.
    const int64_t ahead = start + kPrefetchTiles * kTile;
    const int64_t num_next = std::clamp<int64_t>(context_len - ahead, 0, kTile);
    for (int64_t i = 0; i < num_next; ++i) next[i] = offset_of(ahead + i);
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t n_row = std::min(n, p.context_lens[b + r] - start);  // this row's positions in the tile
      if (n_row <= 0) continue;
      const int64_t row_next = r == 0 ? num_next : 0;  // the first row's pass asks for the next tile
      float* row_scores = scores + r * per_row * kTile;
      if constexpr (kD > 0 && kD % 16 == 0) {
        constexpr int64_t kC = kD / 16;
        for (int64_t h = 0; h < num_kv; ++h) {
          for_groups<kC>(r * per_row + h * rep, r * per_row + (h + 1) * rep, [&](auto group, int64_t j0) {
            score_group<scalar_t, kC, decltype(group)::value>(q, keys, offsets, n_row, h, j0, p.scale, scores,
                                                              next, j0 == r * per_row + h * rep ? row_next : 0);
          });
        }
      } else {
        score_tile(q + r * per_row * d, keys, offsets, n_row, num_kv, rep, d, p.scale, row_scores);
      }
      for (int64_t jj = 0; jj < per_row; ++jj) {
        const int64_t j = r * per_row + jj;
        softmax_tile(scores + j * kTile, n_row, p.softcap, running_max[j], running_sum[j], acc + j * d, d);
      }
      if constexpr (kD > 0 && kD % 16 == 0) {
        constexpr int64_t kC = kD / 16;
        for (int64_t h = 0; h < num_kv; ++h) {
          for_groups<kC>(r * per_row + h * rep, r * per_row + (h + 1) * rep, [&](auto group, int64_t j0) {
            value_group<scalar_t, kC, decltype(group)::value>(acc, values, offsets, n_row, h, j0, scores, next,
                                                              j0 == r * per_row + h * rep ? row_next : 0);
          });
        }
      } else {
        for (int64_t i = 0; i < n_row; ++i) {
          for (int64_t h = 0; h < num_kv; ++h) {
            const scalar_t* v = values + offsets[i] + h * d;
            for (int64_t k = 0; k < rep; ++k) {
              const int64_t j = r * per_row + h * rep + k;
              add_scaled(acc + j * d, scores[j * kTile + i], v, d);
            }
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t row_len = p.context_lens[b + r];
    if (split > last_split(row_len)) continue;  // a shorter row of the group, with nothing in this split
    if (num_splits(p, row_len) > 1) {  // a partial result: (max, sum, unnormalised output) per query head
      float* record = p.partials + (p.partial_offsets[b + r] + (split - first_split(p, row_len)) * p.num_heads +
                                    h0 * rep) * (d + 2);
      for (int64_t jj = 0; jj < per_row; ++jj, record += d + 2) {
        const int64_t j = r * per_row + jj;
        record[0] = running_max[j];
        record[1] = running_sum[j];
        std::copy_n(acc + j * d, d, record + 2);
      }
      continue;
    }
    float* out = p.out + ((b + r) * p.num_heads + h0 * rep) * d;
    for (int64_t jj = 0; jj < per_row; ++jj) {
      const int64_t j = r * per_row + jj;
      const float inverse = running_sum[j] > 0.f ? 1.f / running_sum[j] : 0.f;  // empty context: zeros
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) out[jj * d + e] = acc[j * d + e] * inverse;
    }
  }
}

template <typename scalar_t, int64_t kD>
void run(Problem p, const scalar_t* keys, const scalar_t* values, int64_t batch) {
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
  // Dynamic scheduling: contexts differ in length, so equal static shares would leave a thread idle.
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < num_items; ++k) {
      const Item& item = items[k];
      attend_rows<scalar_t, kD>(p, keys, values, item.row, item.num_rows, item.h0, item.h1, item.split, scratch);
    }
#pragma omp for schedule(static)
    for (int64_t k = 0; k < num_merged; ++k) merge_splits(p, merged_rows[k]);
  }
}

template <typename scalar_t>
void dispatch_head_dim(const Problem& p, const at::Tensor& key_cache, const at::Tensor& value_cache, int64_t batch) {
  const scalar_t* keys = key_cache.data_ptr<scalar_t>();
  const scalar_t* values = value_cache.data_ptr<scalar_t>();
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

at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& block_table, const at::Tensor& block_offsets,
                                  const at::Tensor& context_lens, int64_t block_size, double scale,
                                  int64_t sliding_window, double softcap) {
  TORCH_CHECK(query.dim() == 3 && query.scalar_type() == at::kFloat, "query must be float32 [B, Hq, D]");
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes(),
              "key/value caches must be [num_slots, Hkv, D] of one shape");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type() &&
                  (key_cache.scalar_type() == at::kFloat || key_cache.scalar_type() == at::kBFloat16),
              "key/value caches must both be float32 or both bfloat16");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "key/value caches must be contiguous");
  TORCH_CHECK(key_cache.size(2) == query.size(2), "head_dim of the query and the cache differ");
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
            static_cast<float>(softcap), nullptr, nullptr};
  if (key_cache.scalar_type() == at::kFloat) {
    dispatch_head_dim<float>(p, key_cache, value_cache, batch);
  } else {
    dispatch_head_dim<at::BFloat16>(p, key_cache, value_cache, batch);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(radixlm, m) {
  m.def("paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
        "Tensor block_offsets, Tensor context_lens, int block_size, float scale, int sliding_window, "
        "float softcap) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
