// Causal attention over prefill chunks in bfloat16, flash-attention style, its two products on AMX-BF16 tiles where
// the CPU has them, else with AVX-512's bfloat16 dot product (vdpbf16ps).
//
// Why our own: PyTorch's CPU flash SDPA ran a 2,000-token prefill of the default model at 0.11 TFLOP/s on a Zen 4
// (2 threads, bfloat16 or float32 alike; 41.6 ms a layer, half of the prefill), where its bfloat16 matmul reaches
// 0.41; on a Xeon with AMX, whose tiles SDPA uses too, at 0.45-0.5 TFLOP/s (9.2-10.3 ms a layer) against 0.63 for
// the tiles here (7.1-7.3 ms), and the paged entry below has no counterpart in SDPA.
//
// K and V are first repacked per KV head into the dot product's pair layout (one pass, O(L)): a block of 64 keys
// holds, for each pair of dimensions, the 64 keys' pairs as 32-bit words (`kp`, so 16 keys' scores are one vector
// of dot products), and, for each pair of consecutive keys, their D values interleaved (`vp`, so the probabilities of
// two keys multiply 16 dimensions at once), which are also the tiles' B operands as they are. A work item is a run
// of query positions of one chunk and one KV head, with every query head that shares it (up to 64 rows); it walks
// the key blocks its rows may see with an online softmax (prefill_blocks.h; on AMX tiles prefill_resident.h for head
// sizes up to 64, which keeps each 16 rows' output on the tiles, and prefill_tiles.h above), its scores,
// probabilities and output in float32 scratch, and writes each row once.
//
// The paged entry takes every chunk of a step in one call, reading K/V from the cache through block tables. Chunks
// that share a cached prefix (the same cache blocks) share its packed key blocks: a shared prefix is packed once
// per layer and stays in cache for every chunk that reads it.
#include "prefill_attention.h"

#include <omp.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "../amx_tiles.h"
#include "../linear/amx_bf16.h"
#include "key_packing.h"
#include "prefill_blocks.h"
#include "prefill_resident.h"

namespace {

using radixlm_prefill::kKeys;
using radixlm_prefill::kMaxRows;
using radixlm_prefill::pack_block;
using radixlm_prefill::Packing;
using radixlm_prefill::Problem;
using radixlm_prefill::Rows;
using radixlm_prefill::Scratch;

constexpr int64_t kSerialMacs = int64_t{1} << 20;  // below this many multiply-adds one thread runs it all

// One chunk: query rows first_row .. first_row + num_queries - 1 of the step, the last positions of a context of
// num_keys keys, whose key block b is packed block groups[b].
struct Segment {
  int64_t first_row, num_queries, num_keys;
  std::vector<int64_t> groups;
};

// The item's `rows` rows (begun) over key blocks first .. last of chunk `s`, a block at a time: on the tiles for head
// sizes above kResidentDim, else on the dot product.
template <typename Position>
RADIXLM_AVX512_BF16 void attend_blocks(const Problem& p, const Segment& s, Scratch& w, int64_t h, int64_t rows,
                                       int64_t first, int64_t last, Position position) {
  using namespace radixlm_prefill;
  for (int64_t b = first; b <= last; ++b) {
    const uint32_t* kblock = p.key_block(s.groups[b], h);
    const uint32_t* vblock = p.value_block(s.groups[b], h);
    if (p.tiles) {
      amx_block(p, w, rows, b, kblock, vblock, position);
      continue;
    }
    int64_t r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4) block_scores<4>(p, w, r0, kblock);
    for (; r0 < rows; ++r0) block_scores<1>(p, w, r0, kblock);
    if (sees_whole(p, 0, rows, b * kKeys, kKeys, position)) {
      whole_step_softmax<kKeyVecs>(p, w, 0, rows);
    } else {
      for (int64_t r = 0; r < rows; ++r) block_softmax(p, w, r, position(r), b * kKeys);
    }
    for (r0 = 0; r0 + 4 <= rows; r0 += 4) row_tile<4>(p, w, r0, vblock);
    for (; r0 < rows; ++r0) row_tile<1>(p, w, r0, vblock);
  }
}

// Positions t0 .. t1 - 1 of chunk `s` with KV head h and all its query heads: row r is position t0 + r / rep of
// query head h * rep + r % rep.
RADIXLM_AVX512_BF16 void attend_item(const Problem& p, const Segment& s, Scratch& w, int64_t h, int64_t t0,
                                     int64_t t1) {
  using namespace radixlm_prefill;
  const int64_t rows = (t1 - t0) * p.rep, offset = s.num_keys - s.num_queries, half = p.head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(w.q.data() + r * half, p.q.at(s.first_row + t0 + r / p.rep, h * p.rep + r % p.rep), p.head_dim * 2);
  }
  begin_rows(p, w, rows);
  const auto position = [&](int64_t r) { return offset + t0 + r / p.rep; };
  if (p.tiles && p.head_dim <= kResidentDim) {
    const auto blocks = [&](int64_t b) {
      return std::pair{p.key_block(s.groups[b], h), p.value_block(s.groups[b], h)};
    };
    resident_rows(p, w, rows, blocks, position);
  } else {
    attend_blocks(p, s, w, h, rows, p.first_key(offset + t0) / kKeys, (offset + t1 - 1) / kKeys, position);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inverse = 1.f / row_sum(w, r);
    uint16_t* dst = p.out.at(s.first_row + t0 + r / p.rep, h * p.rep + r % p.rep);
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += 16) {
      const __m512 o = _mm512_mul_ps(_mm512_loadu_ps(w.out.data() + r * p.head_dim + d0), _mm512_set1_ps(inverse));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d0), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(o)));
    }
  }
}

struct Item {
  int64_t segment, head, t0, t1, cost;
};

// Every chunk's positions in runs of at most kMaxRows / rep (split evenly: 32 positions of 3 heads make two runs of
// 16, not 21 and 11), for each KV head; the costliest (most rows times keys) first, so the short ones fill the end.
std::vector<Item> plan_items(const Problem& p, const std::vector<Segment>& segments, int64_t* macs) {
  std::vector<Item> items;
  const int64_t most = std::max<int64_t>(1, kMaxRows / p.rep);
  *macs = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(segments.size()); ++i) {
    const Segment& s = segments[i];
    const int64_t runs = (s.num_queries + most - 1) / most, length = (s.num_queries + runs - 1) / runs;
    for (int64_t t0 = 0; t0 < s.num_queries; t0 += length) {
      const int64_t t1 = std::min(s.num_queries, t0 + length);
      const int64_t cost = (t1 - t0) * p.rep * (s.num_keys - s.num_queries + t1);
      *macs += cost * p.num_kv_heads * p.head_dim;
      for (int64_t h = 0; h < p.num_kv_heads; ++h) items.push_back({i, h, t0, t1, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

// Packs the key blocks, then runs every item, both spread over the threads.
void run(Problem p, const Packing& src, const std::vector<Segment>& segments) {
  int64_t macs = 0;
  const std::vector<Item> items = plan_items(p, segments, &macs);
  const int64_t num_groups = src.num_groups();
  p.num_groups = num_groups;
  at::Tensor kp = at::empty({std::max<int64_t>(1, num_groups * p.num_kv_heads * kKeys * p.head_dim / 2)}, at::kInt);
  at::Tensor vp = at::empty_like(kp);
  p.kp = reinterpret_cast<uint32_t*>(kp.data_ptr<int32_t>());
  p.vp = reinterpret_cast<uint32_t*>(vp.data_ptr<int32_t>());
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int num_threads = macs < kSerialMacs ? 1 : static_cast<int>(std::min<int64_t>(at::get_num_threads(),
                                                                                       num_items));
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < num_groups * p.num_kv_heads; ++k) {
      pack_block(p, src, k % num_groups, k / num_groups);
    }
    // + 1: its arrays off 4 KiB multiples.
    Scratch scratch((std::max(kMaxRows, p.rep) + 15) / 16 * 16 + 1, p.head_dim);
    if (p.tiles) radixlm::amx::configure_tiles();
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < num_items; ++k) {
      const Item& item = items[k];
      attend_item(p, segments[item.segment], scratch, item.head, item.t0, item.t1);
    }
    if (p.tiles) radixlm::amx::release_tiles();
  }
}

// A whole 64-key block by the cache blocks that hold it: their ids, after its first key's offset in the first.
using SharedBlocks = std::map<std::vector<int64_t>, int64_t>;  // -> its packed block

// Chunk `spec` (first row, rows, context, offset of its blocks in `table`, all checked) with its key blocks added to
// `src`: a whole block that an earlier chunk's whole block already packed (the same cache blocks: a shared prefix)
// is reused; a part-filled last block is always the chunk's own (zeros past its context).
Segment plan_segment(const int64_t* spec, const int32_t* table, int64_t block_size, Packing& src,
                     SharedBlocks& shared) {
  const int64_t num_keys = spec[2], offset = spec[3];
  Segment s{spec[0], spec[1], num_keys, std::vector<int64_t>((num_keys + kKeys - 1) / kKeys)};
  for (int64_t b = 0; b < static_cast<int64_t>(s.groups.size()); ++b) {
    const int64_t j0 = b * kKeys, j1 = std::min(num_keys, j0 + kKeys);  // its keys j0 .. j1 - 1
    const bool whole = j1 - j0 == kKeys;
    std::vector<int64_t> key{j0 % block_size};
    for (int64_t t = j0 / block_size; t <= (j1 - 1) / block_size; ++t) key.push_back(table[offset + t]);
    const auto found = whole ? shared.find(key) : shared.end();
    if (found != shared.end()) {
      s.groups[b] = found->second;
      continue;
    }
    s.groups[b] = src.num_groups();
    for (int64_t j = j0; j < j0 + kKeys; ++j) {
      src.slots.push_back(j < j1 ? table[offset + j / block_size] * block_size + j % block_size : -1);
    }
    if (whole) shared.emplace(std::move(key), s.groups[b]);
  }
  return s;
}

void check_rows(const at::Tensor& t, const char* name, int64_t head_dim) {
  TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage(), name,
              " must be a dense CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 && t.dim() == 3 && t.stride(2) == 1, name,
              " must be bfloat16 [n, heads, D] with D contiguous");
  TORCH_CHECK(t.size(2) == head_dim, name, " has head size ", t.size(2), ", query ", head_dim);
}

Rows rows_of(const at::Tensor& t) {
  return {reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()), t.stride(0), t.stride(1)};
}

// The checks and the Problem both entries share; key and value are [L, Hkv, D] tensors or caches [slots, Hkv, D].
Problem make_problem(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor& out,
                     double scale, int64_t sliding_window, double softcap, bool tiles) {
  TORCH_CHECK(radixlm::prefill_attention_available(), "prefill attention needs a CPU with AVX-512 BF16");
  const int64_t head_dim = query.size(-1);
  for (const auto& [t, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}, {&out, "out"}}) {
    check_rows(*t, name, head_dim);
  }
  TORCH_CHECK(head_dim % 16 == 0 && head_dim <= 512, "head size must be a multiple of 16 up to 512, got ", head_dim);
  TORCH_CHECK(out.sizes() == query.sizes() && value.sizes() == key.sizes(), "out must match query, value key");
  const int64_t num_kv_heads = key.size(1);
  TORCH_CHECK(num_kv_heads > 0 && query.size(1) % num_kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(std::isfinite(scale) && std::isfinite(softcap) && softcap >= 0 && sliding_window >= 0,
              "scale and softcap must be finite, softcap and sliding_window not negative");
  TORCH_CHECK(!tiles || (radixlm::amx_bf16_available() && head_dim % 32 == 0),
              "tiles need a CPU with AMX-BF16 and a head size that is a multiple of 32, got ", head_dim);
  return {rows_of(query), rows_of(out), num_kv_heads, query.size(1) / num_kv_heads, head_dim, 0,
          static_cast<float>(scale), static_cast<float>(softcap), sliding_window, tiles, nullptr, nullptr};
}

}  // namespace

namespace radixlm {

bool prefill_attention_available() { return isa::cpu_has_avx512_bf16(); }

void prefill_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor& out,
                       double scale, int64_t sliding_window, double softcap, bool tiles) {
  const Problem p = make_problem(query, key, value, out, scale, sliding_window, softcap, tiles);
  const int64_t num_queries = query.size(0), num_keys = key.size(0);
  TORCH_CHECK(num_keys >= num_queries, "the context (", num_keys, " keys) must hold the chunk's ", num_queries,
              " queries");
  if (num_queries == 0) return;
  const int64_t num_blocks = (num_keys + kKeys - 1) / kKeys;
  Packing src{rows_of(key), rows_of(value), std::vector<int64_t>(num_blocks * kKeys)};
  for (int64_t j = 0; j < num_blocks * kKeys; ++j) src.slots[j] = j < num_keys ? j : -1;
  std::vector<Segment> segments{{0, num_queries, num_keys, std::vector<int64_t>(num_blocks)}};
  for (int64_t b = 0; b < num_blocks; ++b) segments[0].groups[b] = b;
  run(p, src, segments);
}

void prefill_attention_paged(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                             at::Tensor& out, const at::Tensor& block_table, const at::Tensor& segments,
                             int64_t block_size, double scale, int64_t sliding_window, double softcap,
                             bool tiles) {
  const Problem p = make_problem(query, key_cache, value_cache, out, scale, sliding_window, softcap, tiles);
  TORCH_CHECK(block_table.device().is_cpu() && block_table.scalar_type() == at::kInt && block_table.dim() == 1 &&
                  block_table.is_contiguous(), "block_table must be a contiguous CPU int32 vector");
  TORCH_CHECK(segments.device().is_cpu() && segments.scalar_type() == at::kLong && segments.dim() == 2 &&
                  segments.size(1) == 4 && segments.is_contiguous(), "segments must be contiguous CPU int64 [n, 4]");
  TORCH_CHECK(block_size > 0 && block_size <= key_cache.size(0), "block_size must be in [1, cache slots]");
  const int64_t num_slots = key_cache.size(0), table_len = block_table.numel(), num_rows = query.size(0);
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t* spec = segments.data_ptr<int64_t>();
  Packing src{rows_of(key_cache), rows_of(value_cache), {}};
  SharedBlocks shared;
  std::vector<Segment> parts;
  for (int64_t i = 0; i < segments.size(0); ++i) {
    const int64_t* chunk = spec + 4 * i;
    const int64_t first_row = chunk[0], num_queries = chunk[1], num_keys = chunk[2], offset = chunk[3];
    // Written so that no sum can overflow, whatever the values.
    TORCH_CHECK(first_row >= 0 && first_row < num_rows && num_queries >= 1 && num_queries <= num_rows - first_row &&
                    num_keys >= num_queries, "segment ", i, ": rows ", first_row, " + ", num_queries, " of ",
                num_rows, ", context ", num_keys);
    const int64_t num_blocks = num_keys / block_size + (num_keys % block_size != 0);
    TORCH_CHECK(offset >= 0 && offset <= table_len && num_blocks <= table_len - offset, "segment ", i,
                "'s blocks run past the block table");
    for (int64_t t = offset; t < offset + num_blocks; ++t) {
      TORCH_CHECK(table[t] >= 0 && (table[t] + int64_t{1}) * block_size <= num_slots, "segment ", i, ": block ",
                  table[t], " is outside the cache");
    }
    parts.push_back(plan_segment(chunk, table, block_size, src, shared));
  }
  if (!parts.empty()) run(p, src, parts);
}

}  // namespace radixlm
