// The shared-prefix part of the paged decode kernel (paged_attention.cpp), on bfloat16 caches: decoding rows whose
// contexts begin with the same cache blocks (the radix cache hands every request of a shared prompt the same blocks)
// attend those positions together, as the many query rows of one prefill-style work item over keys packed once
// (decode_cascade.cpp), instead of each reading the prefix from memory for its own few query heads. Each row then
// attends its own positions in the decode kernel's items, and the two partial results merge as the splits of a long
// context do. At 32 rows over a shared 1,000-token prefix this turns 32 reads of the prefix into one and the rows'
// products into 16-row tile products.
#pragma once

#include <cstdint>
#include <vector>

namespace radixlm_cascade {

// What a group must share for the shared part to pay; smaller ones are left to the decode items. Its cost is mostly
// fixed (packing the keys, a fork): 32 rows over a shared 960 of 1,056 positions took 0.28 ms a layer against 1.11
// for the decode items alone, 8 rows 0.13 against 0.28, 4 rows 0.11 against 0.12, 2 rows 0.09 against 0.05 (this
// Xeon, caches warm; benchmarks/decode_cascade.py).
constexpr int64_t kMinSharedKeys = 256;
constexpr int64_t kMinRows = 4;

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
  bool tiles;  // the products on AMX-BF16 tiles (head_dim a multiple of 32), else AVX-512's bfloat16 dot product
  float* partials;
  const int64_t* record_offsets;
};

// Whether this CPU runs attend_shared (AVX-512 BF16) for a head size (a multiple of 32).
bool shared_part_available(int64_t head_dim);

// Every group's shared positions attended by every member row, one partial record per (row, query head).
void attend_shared(const SharedProblem& p, const std::vector<Group>& groups);

}  // namespace radixlm_cascade
