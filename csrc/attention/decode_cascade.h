// The shared-prefix part of the paged decode kernel (paged_attention.cpp), on bfloat16 caches: decoding rows whose
// contexts begin with the same cache blocks (the radix cache hands every request of a shared prompt the same blocks)
// attend those positions together, as the many query rows of one prefill-style work item over keys packed once
// (decode_cascade.cpp), instead of each reading the prefix from memory for its own few query heads. Each row then
// attends its own positions in the decode kernel's items, and the two partial results merge as the splits of a long
// context do. At 32 rows over a shared 1,000-token prefix this turns 32 reads of the prefix into one and the rows'
// products into 16-row tile products.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace radixlm_cascade {

// What a group must share for the shared part to pay; smaller ones are left to the decode items. Measured for the
// rows: one layer's call with cold caches (a forward's 30 layers in turn), 9/3 heads of 64 on this Xeon, rows over a
// shared 992 of 1,056 positions, against the same call in a build with the part off: 2 rows 0.109 against 0.070 ms,
// 3 rows 0.079 against 0.091, 4 rows 0.081 against 0.111; 4 prefixes of 2 rows each 0.371 against 0.286, of 4 rows
// 0.421 against 0.499. The positions' minimum (four packed blocks) is a choice, not a measurement.
constexpr int64_t kMinSharedKeys = 256;
constexpr int64_t kMinRows = 3;

// Rows of a step whose contexts share their first `num_keys` positions (a multiple of 64, the packed blocks' keys):
// the same cache blocks, `blocks` being one member's table from its offset.
struct Group {
  std::vector<int64_t> rows;  // ascending
  const int32_t* blocks;
  int64_t num_keys;
};

// The groups among `batch` rows of a decode step: rows with lone[b] (a plain decode, one query row of its request)
// whose tables begin with the same blocks, at least kMinSharedKeys positions of them before the block that holds the
// row's last position (the block the step writes), and at least kMinRows rows to a group. Tables are as the paged op
// takes them (flat, row b's from offsets[b]; lens the context lengths), already checked.
std::vector<Group> find_groups(const int32_t* table, const int32_t* offsets, const int32_t* lens,
                               const std::vector<uint8_t>& lone, int64_t batch, int64_t block_size);

// One decode call's data as the shared part reads it: bfloat16 queries ([B, Hq, D], D contiguous, bits as uint16)
// and caches ([slots, Hkv, D] contiguous), the head layout and the softmax's parameters, and where its results go:
// row b's record for query head h at partials + (record_offsets[b] + h) * (D + 2), as (max, sum, D unnormalised
// outputs), the decode kernel's partial record.
struct SharedProblem {
  const uint16_t* query;
  int64_t query_stride_b, query_stride_h;
  const uint16_t* keys;
  const uint16_t* values;
  int64_t num_kv_heads, rep, head_dim, block_size;
  float scale, softcap;
  float* partials;
  const int64_t* record_offsets;
};

// Whether this CPU runs the shared part (AMX-BF16, allowed by the OS) for a head size (a multiple of 32).
bool shared_part_available(int64_t head_dim);

// Every group's shared positions attended by every member row, one partial record per (row, query head), as work
// items the decode kernel's threads take beside its own: an item per group and KV head, which packs that head's
// shared keys into the pair layouts (key_packing.h) and runs the member rows through them while they are in its
// core's cache. Each thread that runs items calls begin_items first (its scratch, the tiles' configuration) and
// end_items after.
class SharedPart {
 public:
  SharedPart(const SharedProblem& p, const std::vector<Group>& groups, int64_t num_threads);
  ~SharedPart();
  SharedPart(const SharedPart&) = delete;
  SharedPart& operator=(const SharedPart&) = delete;

  int64_t num_items() const;
  void begin_items(int64_t thread) const;
  void attend(int64_t k, int64_t thread) const;
  void end_items() const;

 private:
  struct Plan;
  std::unique_ptr<Plan> plan_;
};

}  // namespace radixlm_cascade
