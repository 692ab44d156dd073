// The K/V write of kv_write.cpp, for its dispatcher registration (csrc/bindings.cpp).
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// key_cache[slot_mapping[t]] = keys[t] and value_cache[slot_mapping[t]] = values[t]: caches [num_slots, Hkv, D]
// float32 or bfloat16, rows float32 [T, Hkv, D] (any strides, D contiguous), rounded to the caches' dtype as
// index_copy_ rounds. A slot outside the cache is an error.
void write_kv(at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& slot_mapping, const at::Tensor& keys,
              const at::Tensor& values);

}  // namespace radixlm
