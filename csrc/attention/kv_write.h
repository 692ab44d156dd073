// The K/V write of kv_write.cpp, for its dispatcher registration (csrc/bindings.cpp).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

namespace radixlm {

// key_cache[slot_mapping[t]] = keys[t] and value_cache[slot_mapping[t]] = values[t]: caches [num_slots, Hkv, D]
// float32, bfloat16 (rounded as index_copy_ rounds) or int8 (with key_scales/value_scales [num_slots, Hkv] float16,
// quantized as kv_rows.h says), rows float32 [T, Hkv, D] (any strides, D contiguous). A slot outside the cache is an
// error.
void write_kv(at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& slot_mapping, const at::Tensor& keys,
              const at::Tensor& values, const c10::optional<at::Tensor>& key_scales,
              const c10::optional<at::Tensor>& value_scales);

}  // namespace radixlm
