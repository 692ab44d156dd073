// The paged decode attention op of paged_attention.cpp, for its dispatcher registration and the direct entry point in
// csrc/bindings.cpp.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

namespace radixlm {

// query [B, Hq, D] float32 (any strides; copied unless D is contiguous) over caches [num_slots, Hkv, D] (float32,
// bfloat16, or int8 with key_scales/value_scales [num_slots, Hkv] float16: kv_rows.h) through the flat block table
// -> [B, Hq, D]. With slot_mapping, new_keys and new_values (all or none;
// float32 [B, Hkv, D] rows, D contiguous) it first writes each row's new K/V at its slot, as write_kv does: one call
// per layer instead of two when every row of a step decodes. See paged_attention.cpp.
at::Tensor paged_decode_attention(const at::Tensor& query, at::Tensor key_cache, at::Tensor value_cache,
                                  const at::Tensor& block_table, const at::Tensor& block_offsets,
                                  const at::Tensor& context_lens, int64_t block_size, double scale,
                                  int64_t sliding_window, double softcap,
                                  const c10::optional<at::Tensor>& slot_mapping,
                                  const c10::optional<at::Tensor>& new_keys,
                                  const c10::optional<at::Tensor>& new_values,
                                  const c10::optional<at::Tensor>& key_scales,
                                  const c10::optional<at::Tensor>& value_scales);

}  // namespace radixlm
