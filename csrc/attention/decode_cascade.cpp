// The shared-prefix part of the paged decode kernel: see decode_cascade.h. A group's shared positions are packed per
// KV head into the prefill kernel's 64-key blocks once (key_packing.h), then its member rows go through every block,
// up to 64 query rows at a time (members times the query heads of one KV head), with prefill_blocks.h's AMX steps:
// scores, online softmax and values. No mask: every member sees every shared position. AMX only: on CPUs with AVX-512
// BF16 and no AMX the prefill kernel's dot-product steps could serve, unmeasured there so far (docs/followups.md).
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
#include "prefill_blocks.h"
#include "prefill_resident.h"

namespace radixlm_cascade {

namespace {

using radixlm_prefill::kKeys;
using radixlm_prefill::kMaxRows;
using radixlm_prefill::Packing;
using radixlm_prefill::Problem;
using radixlm_prefill::Rows;
using radixlm_prefill::Scratch;

// Blocks that row b's table shares with the leader's, from the start, up to `limit`.
int64_t common_blocks(const int32_t* a, const int32_t* b, int64_t limit) {
  int64_t k = 0;
  while (k < limit && a[k] == b[k]) ++k;
  return k;
}

struct Item {
  int64_t group, head, cost;
};

// Member rows m0 .. m1 - 1 of group g (its packed blocks from `base`) with KV head h and all its query heads: row r
// of the item is member m0 + r / rep, query head h * rep + r % rep.
RADIXLM_AMX void attend_members(const Problem& p, const SharedProblem& sp, const Group& g, int64_t base,
                                     Scratch& w, int64_t h, int64_t m0, int64_t m1) {
  using namespace radixlm_prefill;
  const int64_t rows = (m1 - m0) * p.rep, half = p.head_dim / 2, d = p.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* q = sp.query + g.rows[m0 + r / p.rep] * sp.query_stride_b + (h * p.rep + r % p.rep) *
                                                                                   sp.query_stride_h;
    std::memcpy(w.q.data() + r * half, q, d * 2);
  }
  begin_rows(p, w, rows);
  const auto last_key = [&](int64_t) { return g.num_keys - 1; };  // every row sees every block whole: no mask
  if (p.head_dim <= kResidentDim) {
    const auto blocks = [&](int64_t b) { return std::pair{p.key_block(base + b, h), p.value_block(base + b, h)}; };
    resident_rows(p, w, rows, blocks, last_key);
  } else {
    for (int64_t b = 0; b < g.num_keys / kKeys; ++b) {
      amx_block(p, w, rows, b, p.key_block(base + b, h), p.value_block(base + b, h), last_key);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = h * p.rep + r % p.rep;
    float* record = sp.partials + (sp.record_offsets[g.rows[m0 + r / p.rep]] + head) * (d + 2);
    record[0] = w.max[r];
    record[1] = row_sum(w, r);
    std::copy_n(w.out.data() + r * d, d, record + 2);
  }
}

// A work item per group and KV head (it packs that head's blocks, then runs its members through them while they are
// in its core's cache), the costliest first.
std::vector<Item> plan_items(const Problem& p, const std::vector<Group>& groups) {
  std::vector<Item> items;
  for (int64_t i = 0; i < static_cast<int64_t>(groups.size()); ++i) {
    const int64_t cost = static_cast<int64_t>(groups[i].rows.size()) * groups[i].num_keys;
    for (int64_t h = 0; h < p.num_kv_heads; ++h) items.push_back({i, h, cost});
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
  return radixlm::amx_bf16_available() && head_dim % 32 == 0 && head_dim <= 512;
}

struct SharedPart::Plan {
  SharedProblem shared;
  const std::vector<Group>& groups;
  Packing src;
  std::vector<int64_t> bases;  // group g's packed blocks from bases[g]
  Problem p;
  std::vector<Item> items;
  std::unique_ptr<uint32_t[]> kp, vp;  // not zeroed: packing writes every word
  std::vector<std::unique_ptr<Scratch>> scratch;  // one a thread, made by the thread that uses it
};

SharedPart::SharedPart(const SharedProblem& sp, const std::vector<Group>& groups, int64_t num_threads) {
  const int64_t d = sp.head_dim, row_stride = sp.num_kv_heads * d;
  const Rows keys{const_cast<uint16_t*>(sp.keys), row_stride, d};
  const Rows values{const_cast<uint16_t*>(sp.values), row_stride, d};
  plan_.reset(new Plan{sp, groups, {keys, values, {}}, {}, {}, {}, nullptr, nullptr, {}});
  Plan& plan = *plan_;
  int64_t total_keys = 0;
  for (const Group& g : groups) total_keys += g.num_keys;
  plan.src.slots.reserve(total_keys);
  for (const Group& g : groups) {
    plan.bases.push_back(plan.src.num_groups());
    for (int64_t j = 0, block = 0, within = 0; j < g.num_keys; ++j) {  // the table walked without a division a key
      plan.src.slots.push_back(static_cast<int64_t>(g.blocks[block]) * sp.block_size + within);
      if (++within == sp.block_size) {
        within = 0;
        ++block;
      }
    }
  }
  const int64_t num_blocks = plan.src.num_groups();
  plan.p = Problem{{nullptr, 0, 0}, {nullptr, 0, 0}, sp.num_kv_heads, sp.rep, d, num_blocks, sp.scale, sp.softcap, 0,
                   true, nullptr, nullptr};
  const int64_t packed_words = num_blocks * sp.num_kv_heads * kKeys * d / 2;
  plan.kp.reset(new uint32_t[packed_words]);
  plan.vp.reset(new uint32_t[packed_words]);
  plan.p.kp = plan.kp.get();
  plan.p.vp = plan.vp.get();
  plan.items = plan_items(plan.p, groups);
  plan.scratch.resize(num_threads);
}

SharedPart::~SharedPart() = default;

int64_t SharedPart::num_items() const { return static_cast<int64_t>(plan_->items.size()); }

void SharedPart::begin_items(int64_t thread) const {
  const Problem& p = plan_->p;
  // + 1: its arrays off 4 KiB multiples.
  if (!plan_->scratch[thread]) plan_->scratch[thread].reset(new Scratch((std::max(kMaxRows, p.rep) + 15) / 16 * 16 + 1,
                                                                       p.head_dim));
  radixlm::amx::configure_tiles();
}

void SharedPart::attend(int64_t k, int64_t thread) const {
  const Plan& plan = *plan_;
  const Item& item = plan.items[k];
  const Group& g = plan.groups[item.group];
  const int64_t first_block = plan.bases[item.group], num_blocks = g.num_keys / kKeys;
  // The rows of a block are scattered over the cache, where the hardware's stride prefetchers do not find them:
  // packing them cold waited on memory row by row. Each block's rows are asked for while the one before is packed.
  const auto prefetch_block = [&](int64_t b) {
    const int64_t* slots = plan.src.slots.data() + b * kKeys;
    for (int64_t c = 0; c < kKeys; ++c) {
      const char* key = reinterpret_cast<const char*>(plan.src.k.at(slots[c], item.head));
      const char* value = reinterpret_cast<const char*>(plan.src.v.at(slots[c], item.head));
      for (int64_t offset = 0; offset < plan.p.head_dim * 2; offset += 64) {
        _mm_prefetch(key + offset, _MM_HINT_T0);
        _mm_prefetch(value + offset, _MM_HINT_T0);
      }
    }
  };
  prefetch_block(first_block);
  for (int64_t b = first_block; b < first_block + num_blocks; ++b) {
    if (b + 1 < first_block + num_blocks) prefetch_block(b + 1);
    radixlm_prefill::pack_block(plan.p, plan.src, b, item.head);
  }
  // Members in runs of at most kMaxRows / rep query rows, split evenly.
  const int64_t members = static_cast<int64_t>(g.rows.size()), most = std::max<int64_t>(1, kMaxRows / plan.p.rep);
  const int64_t runs = (members + most - 1) / most, length = (members + runs - 1) / runs;
  for (int64_t m0 = 0; m0 < members; m0 += length) {
    attend_members(plan.p, plan.shared, g, first_block, *plan.scratch[thread], item.head, m0,
                   std::min(members, m0 + length));
  }
}

void SharedPart::end_items() const { radixlm::amx::release_tiles(); }

}  // namespace radixlm_cascade
