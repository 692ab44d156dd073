// The shared-prefix part of the paged decode kernel: see decode_cascade.h. A group's shared positions are packed per
// KV head into the prefill kernel's 64-key blocks once (key_packing.h), then each work item takes up to 64 query rows
// (member rows times the query heads of one KV head) through every block with prefill_blocks.h's steps: scores,
// online softmax and values, on AMX tiles where the CPU has them. No mask: every member sees every shared position.
#include "decode_cascade.h"

#include <omp.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "../amx_tiles.h"
#include "../linear/amx_bf16.h"
#include "key_packing.h"
#include "prefill_attention.h"
#include "prefill_blocks.h"

namespace radixlm_cascade {

namespace {

using radixlm_prefill::kKeys;
using radixlm_prefill::kMaxRows;
using radixlm_prefill::Packing;
using radixlm_prefill::Problem;
using radixlm_prefill::Scratch;

// Blocks that row b's table shares with the leader's, from the start, up to `limit`.
int64_t common_blocks(const int32_t* a, const int32_t* b, int64_t limit) {
  int64_t k = 0;
  while (k < limit && a[k] == b[k]) ++k;
  return k;
}

struct Item {
  int64_t group, head, first, last, cost;  // members first .. last - 1 of the group
};

// Member rows m0 .. m1 - 1 of group g (its packed blocks from `base`) with KV head h and all its query heads: row r
// of the item is member m0 + r / rep, query head h * rep + r % rep.
RADIXLM_AVX512_BF16 void attend_item(const Problem& p, const SharedProblem& sp, const Group& g, int64_t base,
                                     Scratch& w, int64_t h, int64_t m0, int64_t m1) {
  using namespace radixlm_prefill;
  const int64_t rows = (m1 - m0) * p.rep, half = p.head_dim / 2, d = p.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* q = sp.query + g.rows[m0 + r / p.rep] * sp.query_stride_b + (h * p.rep + r % p.rep) *
                                                                                   sp.query_stride_h;
    std::memcpy(w.q.data() + r * half, q, d * 2);
  }
  const int64_t tile_rows = (rows + 15) / 16 * 16;  // the tiles' row groups: the rows past `rows` score zeros
  if (p.tiles) std::fill(w.q.data() + rows * half, w.q.data() + tile_rows * half, 0u);
  std::fill_n(w.out.begin(), rows * d, 0.f);
  std::fill_n(w.max.begin(), rows, -std::numeric_limits<float>::infinity());
  std::fill_n(w.sum.begin(), rows * 16, 0.f);
  const int64_t last_key = g.num_keys - 1;  // every block whole: no mask
  for (int64_t b = 0; b < g.num_keys / kKeys; ++b) {
    const uint32_t* kblock = p.key_block(base + b, h);
    const uint32_t* vblock = p.value_block(base + b, h);
    if (p.tiles) {
      for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t end = std::min(rows, r0 + 16);
        amx_group_scores(p, w, r0, kblock);
        for (int64_t r = r0; r < end; ++r) block_softmax(p, w, r, last_key, b);
        amx_group_values(p, w, r0, end, vblock);
      }
      continue;
    }
    int64_t r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4) block_scores<4>(p, w, r0, kblock);
    for (; r0 < rows; ++r0) block_scores<1>(p, w, r0, kblock);
    for (int64_t r = 0; r < rows; ++r) block_softmax(p, w, r, last_key, b);
    for (r0 = 0; r0 + 4 <= rows; r0 += 4) row_tile<4>(p, w, r0, vblock);
    for (; r0 < rows; ++r0) row_tile<1>(p, w, r0, vblock);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = h * p.rep + r % p.rep;
    float* record = sp.partials + (sp.record_offsets[g.rows[m0 + r / p.rep]] + head) * (d + 2);
    record[0] = w.max[r];
    record[1] = row_sum(w, r);
    std::copy_n(w.out.data() + r * d, d, record + 2);
  }
}

// Each group's members in runs of at most kMaxRows / rep (split evenly), for each KV head, the costliest first.
std::vector<Item> plan_items(const Problem& p, const std::vector<Group>& groups) {
  std::vector<Item> items;
  const int64_t most = std::max<int64_t>(1, kMaxRows / p.rep);
  for (int64_t i = 0; i < static_cast<int64_t>(groups.size()); ++i) {
    const int64_t members = static_cast<int64_t>(groups[i].rows.size());
    const int64_t runs = (members + most - 1) / most, length = (members + runs - 1) / runs;
    for (int64_t m0 = 0; m0 < members; m0 += length) {
      const int64_t m1 = std::min(members, m0 + length);
      for (int64_t h = 0; h < p.num_kv_heads; ++h) {
        items.push_back({i, h, m0, m1, (m1 - m0) * groups[i].num_keys});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

}  // namespace

std::vector<Group> find_groups(const int32_t* table, const int32_t* offsets, const int32_t* lens,
                               const std::vector<uint8_t>& lone, int64_t batch, int64_t block_size) {
  const int64_t min_blocks = (kMinSharedKeys + block_size - 1) / block_size;
  // Blocks row b may share: those before the one holding its last position.
  const auto limit = [&](int64_t b) { return lens[b] > 0 ? (lens[b] - 1) / block_size : int64_t{0}; };
  std::vector<std::pair<int32_t, int64_t>> candidates;  // (first block, row)
  for (int64_t b = 0; b < batch; ++b) {
    if (lone[b] && limit(b) >= min_blocks) candidates.emplace_back(table[offsets[b]], b);
  }
  std::sort(candidates.begin(), candidates.end());
  std::vector<Group> groups;
  for (size_t i = 0, j = 0; i < candidates.size(); i = j) {
    for (j = i; j < candidates.size() && candidates[j].first == candidates[i].first; ++j) {
    }
    if (j - i < static_cast<size_t>(kMinRows)) continue;
    // Members: the rows sharing at least min_blocks with the first; the group shares what all of them do.
    const int64_t leader = candidates[i].second;
    const int32_t* blocks = table + offsets[leader];
    Group g{{leader}, blocks, limit(leader)};
    for (size_t k = i + 1; k < j; ++k) {
      const int64_t row = candidates[k].second;
      const int64_t shared = common_blocks(blocks, table + offsets[row], std::min(limit(leader), limit(row)));
      if (shared < min_blocks) continue;
      g.rows.push_back(row);
      g.num_keys = std::min(g.num_keys, shared);
    }
    g.num_keys = g.num_keys * block_size / kKeys * kKeys;  // blocks -> positions, whole packed blocks
    const bool pays = static_cast<int64_t>(g.rows.size()) >= kMinRows && g.num_keys >= kMinSharedKeys;
    if (pays) groups.push_back(std::move(g));
  }
  return groups;
}

bool shared_part_available(int64_t head_dim) {
  return radixlm::prefill_attention_available() && head_dim % 32 == 0 && head_dim <= 512;
}

void attend_shared(const SharedProblem& sp, const std::vector<Group>& groups) {
  const int64_t d = sp.head_dim, row_stride = sp.num_kv_heads * d;
  Packing src{{const_cast<uint16_t*>(sp.keys), row_stride, d}, {const_cast<uint16_t*>(sp.values), row_stride, d}, {}};
  int64_t total_keys = 0;
  for (const Group& g : groups) total_keys += g.num_keys;
  src.slots.reserve(total_keys);
  std::vector<int64_t> bases;
  for (const Group& g : groups) {
    bases.push_back(src.num_groups());
    for (int64_t j = 0, block = 0, within = 0; j < g.num_keys; ++j) {  // the table walked without a division a key
      src.slots.push_back(static_cast<int64_t>(g.blocks[block]) * sp.block_size + within);
      if (++within == sp.block_size) {
        within = 0;
        ++block;
      }
    }
  }
  const int64_t num_blocks = src.num_groups();
  Problem p{{nullptr, 0, 0}, {nullptr, 0, 0}, sp.num_kv_heads, sp.rep, d, num_blocks, sp.scale, sp.softcap, 0,
            sp.tiles, nullptr, nullptr};
  const std::vector<Item> items = plan_items(p, groups);
  const int64_t packed_words = num_blocks * sp.num_kv_heads * kKeys * d / 2;
  const std::unique_ptr<uint32_t[]> kp(new uint32_t[packed_words]), vp(new uint32_t[packed_words]);  // not zeroed
  p.kp = kp.get();
  p.vp = vp.get();
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int num_threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), num_items));
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < num_blocks * sp.num_kv_heads; ++k) {
      radixlm_prefill::pack_block(p, src, k % num_blocks, k / num_blocks);
    }
    Scratch scratch((std::max(kMaxRows, p.rep) + 15) / 16 * 16 + 1, d);  // + 1: arrays off 4 KiB multiples
    if (p.tiles) radixlm::amx::configure_tiles();
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < num_items; ++k) {
      const Item& item = items[k];
      attend_item(p, sp, groups[item.group], bases[item.group], scratch, item.head, item.first, item.last);
    }
    if (p.tiles) radixlm::amx::release_tiles();
  }
}

}  // namespace radixlm_cascade
