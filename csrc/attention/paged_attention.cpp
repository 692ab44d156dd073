// Paged decode attention on CPU: one call per layer for every decoding request.
//
// Each query row (a decode, or one position of a decode verifying drafts) reads its context in place through its
// block table (slot = block * block_size + offset), so shared prefixes and scattered blocks cost nothing extra.
// Work items are a request's rows (all KV heads: one contiguous run of memory per position), or (rows, KV head)
// pairs when there are too few requests for the threads, spread over OpenMP threads; each K/V row is read once for
// all the query heads and rows that share it (GQA, verification) and the softmax is computed online in one pass
// over the context, tile by tile; contexts longer than kSplitPositions are cut at fixed positions into splits of
// their own, merged after. Storage may be float32, bfloat16 or int8 (with a float16 scale per position and KV head,
// applied to the tile's scores and weights: attention_item.h's scale_tile); arithmetic is float32. The inner loops
// are plain C++ (GCC vector types and AVX-512 where the host has it) that -O3 vectorises.
//
// Given the step's new K/V rows, the op writes them into the caches first (one call per layer instead of two): a
// plain decode's own items write its row right after streaming in the block that holds it, so the stores find their
// lines in cache; rows that other rows read are written before any item starts (see `plan_writes`).
//
// Over a bfloat16 cache with bfloat16 queries, rows that share a prefix (the same leading blocks, enough of them and
// enough rows: decode_cascade.h) first attend it together, and their own items start after it; the shared part's
// result is the first of their partial records.
//
// attention_plan.h holds the problem, its work items and who writes which new row; attention_item.h one item's
// work; attention_stream_in.h the read that brings a chunk of K/V into cache before it is attended;
// attention_softmax.h the softmax phase and the merge of partial records; attention_tiles.h the register-tiled score
// and value phases (head_dim 64 and 128), attention_generic.h those of any other head_dim.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "attention_item.h"
#include "attention_plan.h"
#include "attention_softmax.h"
#include "decode_cascade.h"
#include "paged_attention.h"

namespace {

using namespace radixlm_attention;  // the plan, the work item, the merge of splits

// Rows that are a request's only query row in the step (a plain decode): the ones a shared part may take.
std::vector<uint8_t> lone_rows(const Problem& p, int64_t batch) {
  std::vector<uint8_t> lone(batch);
  for (int64_t b = 0; b < batch; ++b) lone[b] = !continues_run(p, b) && !(b + 1 < batch && continues_run(p, b + 1));
  return lone;
}

// The groups whose shared positions attend_shared takes (decode_cascade.h), with `shared_lens` filled for their
// rows; none where the kernel does not serve this call (bfloat16 query and cache on AMX, no window).
template <typename scalar_t, int64_t kD>
std::vector<radixlm_cascade::Group> plan_shared(const Problem& p, int64_t batch, std::vector<int32_t>& shared_lens) {
  if constexpr (!std::is_same_v<scalar_t, at::BFloat16> || kD <= 0) {
    return {};
  } else {
    if (!p.bf16_io || p.sliding_window > 0 || batch < 2 || !radixlm_cascade::shared_part_available(kD)) return {};
    std::vector<radixlm_cascade::Group> groups = radixlm_cascade::find_groups(
        p.block_table, p.block_offsets, p.context_lens, lone_rows(p, batch), batch, p.block_size);
    if (!groups.empty()) {
      shared_lens.assign(batch, 0);
      for (const auto& g : groups) {
        for (const int64_t b : g.rows) shared_lens[b] = static_cast<int32_t>(g.num_keys);
      }
    }
    return groups;
  }
}

template <typename scalar_t>
radixlm_cascade::SharedProblem shared_problem(const Problem& p, const scalar_t* keys, const scalar_t* values) {
  return {static_cast<const uint16_t*>(p.query), p.query_stride_b, p.query_stride_h,
          reinterpret_cast<const uint16_t*>(keys), reinterpret_cast<const uint16_t*>(values), p.num_kv_heads,
          p.num_heads / p.num_kv_heads, p.head_dim, p.block_size, p.scale, p.softcap, p.partials,
          p.partial_offsets};
}

template <typename scalar_t, int64_t kD>
void run(Problem p, scalar_t* keys, scalar_t* values, int64_t batch, int64_t num_blocks) {
  std::vector<int32_t> shared_lens;
  const std::vector<radixlm_cascade::Group> groups = plan_shared<scalar_t, kD>(p, batch, shared_lens);
  if (!groups.empty()) p.shared_lens = shared_lens.data();
  int64_t num_positions = 0;
  std::vector<int64_t> partial_offsets(batch), merged_rows;
  int64_t num_records = 0;
  for (int64_t b = 0; b < batch; ++b) {
    num_positions += p.context_lens[b] - first_position(p, b);
    partial_offsets[b] = num_records;
    if (radixlm_attention::num_records(p, b) > 0) {
      num_records += radixlm_attention::num_records(p, b) * p.num_heads;
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
  std::vector<uint8_t> writes_own_row;
  if (p.new_rows != nullptr) {
    // Rows that other rows read are written here, in row order (a repeated slot keeps the last row's, as write_kv),
    // before any item starts (and before the shared part reads the cache).
    writes_own_row = plan_writes(p, batch, num_blocks);
    for (int64_t b = 0; b < batch; ++b) {
      if (!writes_own_row[b]) {
        radixlm_kv::write_row(keys, values, p.scales, *p.new_rows, b, 0, p.num_kv_heads, p.num_kv_heads, p.head_dim);
      }
    }
    p.writes_own_row = writes_own_row.data();
  }
  std::unique_ptr<radixlm_cascade::SharedPart> shared;
  int64_t num_shared = 0;
  if (!groups.empty()) {  // its items start after the writes above: they pack from the cache
    shared.reset(new radixlm_cascade::SharedPart(shared_problem(p, keys, values), groups, at::get_num_threads()));
    num_shared = shared->num_items();
  }
  const int64_t region_threads = num_shared > 0 ? at::get_num_threads() : num_threads;
  // Dynamic scheduling: contexts differ in length, so equal static shares would leave a thread idle.
#pragma omp parallel num_threads(region_threads) if (region_threads > 1)
  {
    std::vector<float> scratch;
    // Every other thread staggers its first item, so that the threads' streaming and arithmetic alternate rather
    // than coincide: while one computes from cache, the other has the memory to itself. Items of equal size keep the
    // offset. 64 x 256 positions: 1.06-1.10x -> 1.03-1.06x the read of the same bytes; 64 x 1,024: 1.22x -> 1.14x.
    bool stagger = omp_get_thread_num() % 2 == 1;
    if (num_shared > 0) shared->begin_items(omp_get_thread_num());
    // The shared part's items first (the costliest), then the decode items.
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < num_shared + num_items; ++k) {
      if (k < num_shared) {
        shared->attend(k, omp_get_thread_num());
        continue;
      }
      const Item& item = items[k - num_shared];
      attend_rows<scalar_t, kD>(p, keys, values, item.row, item.num_rows, item.h0, item.h1, item.split, stagger,
                                scratch);
      stagger = false;
    }
    if (num_shared > 0) shared->end_items();
#pragma omp for schedule(static)
    for (int64_t k = 0; k < num_merged; ++k) merge_splits(p, merged_rows[k]);
  }
}

template <typename scalar_t>
void dispatch_head_dim(const Problem& p, at::Tensor& key_cache, at::Tensor& value_cache, int64_t batch) {
  const int64_t num_blocks = key_cache.size(0) / p.block_size;
  scalar_t* keys = key_cache.data_ptr<scalar_t>();
  scalar_t* values = value_cache.data_ptr<scalar_t>();
  if (p.head_dim == 64) {
    run<scalar_t, 64>(p, keys, values, batch, num_blocks);
  } else if (p.head_dim == 128) {
    run<scalar_t, 128>(p, keys, values, batch, num_blocks);
  } else {
    run<scalar_t, 0>(p, keys, values, batch, num_blocks);
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

}  // namespace

namespace radixlm {

// The op; its contract is stated once, in paged_attention.h.
at::Tensor paged_decode_attention(const at::Tensor& query, at::Tensor key_cache, at::Tensor value_cache,
                                  const at::Tensor& block_table, const at::Tensor& block_offsets,
                                  const at::Tensor& context_lens, int64_t block_size, double scale,
                                  int64_t sliding_window, double softcap,
                                  const c10::optional<at::Tensor>& slot_mapping,
                                  const c10::optional<at::Tensor>& new_keys,
                                  const c10::optional<at::Tensor>& new_values,
                                  const c10::optional<at::Tensor>& key_scales,
                                  const c10::optional<at::Tensor>& value_scales) {
  const bool bf16_io = query.scalar_type() == at::kBFloat16;
  TORCH_CHECK(query.dim() == 3 && (bf16_io || query.scalar_type() == at::kFloat),
              "query must be float32 or bfloat16 [B, Hq, D]");
  const radixlm_kv::Scales scales = radixlm_kv::check_caches(key_cache, value_cache, key_scales, value_scales);
  TORCH_CHECK(key_cache.size(2) == query.size(2), "head_dim of the query and the cache differ");
  TORCH_CHECK(query.size(2) > 0 && key_cache.size(1) > 0, "head_dim and the number of KV heads must be positive");
  TORCH_CHECK(query.size(2) <= radixlm_kv::kMaxHeadDim, "head_dim must be at most ", radixlm_kv::kMaxHeadDim);
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
  Problem p{q.data_ptr(), out.data_ptr(), block_table.data_ptr<int32_t>(),
            block_offsets.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(), q.stride(0), q.stride(1),
            num_heads, num_kv_heads, q.size(2), block_size, sliding_window, static_cast<float>(scale),
            static_cast<float>(softcap), nullptr, nullptr, nullptr, nullptr, scales, bf16_io};
  radixlm_kv::NewRows rows{};
  TORCH_CHECK(slot_mapping.has_value() == new_keys.has_value() && new_keys.has_value() == new_values.has_value(),
              "slot_mapping, new_keys and new_values go together");
  if (slot_mapping.has_value()) {
    rows = radixlm_kv::check_new_rows(key_cache, *slot_mapping, *new_keys, *new_values);
    TORCH_CHECK(slot_mapping->size(0) == batch, "one new K/V row per query row");
    p.new_rows = &rows;
  }
  if (key_cache.scalar_type() == at::kFloat) {
    dispatch_head_dim<float>(p, key_cache, value_cache, batch);
  } else if (key_cache.scalar_type() == at::kBFloat16) {
    dispatch_head_dim<at::BFloat16>(p, key_cache, value_cache, batch);
  } else {
    dispatch_head_dim<int8_t>(p, key_cache, value_cache, batch);
  }
  return out;
}

}  // namespace radixlm
