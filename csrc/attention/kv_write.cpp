// Writing a step's new K/V rows into the paged caches: cache[slot_mapping[t]] = rows[t] for the keys and values.
//
// PyTorch's index_copy_ does this too, but each call pays for TensorIterator set-up and a parallel region: about 6
// to 30 microseconds, twice per layer, against a fraction of that for the bytes themselves (a few kilobytes at
// decode). One plain loop for both caches on the calling thread is what the work needs. (When every row of a step
// decodes, the decode kernel writes the rows itself: paged_attention.cpp.)

#include "kv_write.h"

#include <ATen/ATen.h>

#include <cstdint>

#include "kv_rows.h"

namespace {

template <typename scalar_t>
void write_all(at::Tensor& key_cache, at::Tensor& value_cache, const radixlm_kv::Scales& scales,
               const radixlm_kv::NewRows& rows, int64_t num_rows) {
  const int64_t num_kv_heads = key_cache.size(1), head_dim = key_cache.size(2);
  scalar_t* keys = key_cache.data_ptr<scalar_t>();
  scalar_t* values = value_cache.data_ptr<scalar_t>();
  for (int64_t t = 0; t < num_rows; ++t) {
    radixlm_kv::write_row(keys, values, scales, rows, t, 0, num_kv_heads, num_kv_heads, head_dim);
  }
}

}  // namespace

void radixlm::write_kv(at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& slot_mapping,
                       const at::Tensor& keys, const at::Tensor& values, const c10::optional<at::Tensor>& key_scales,
                       const c10::optional<at::Tensor>& value_scales) {
  const radixlm_kv::Scales scales = radixlm_kv::check_caches(key_cache, value_cache, key_scales, value_scales);
  const radixlm_kv::NewRows rows = radixlm_kv::check_new_rows(key_cache, slot_mapping, keys, values);
  const int64_t num_rows = slot_mapping.size(0);
  if (key_cache.scalar_type() == at::kFloat) {
    write_all<float>(key_cache, value_cache, scales, rows, num_rows);
  } else if (key_cache.scalar_type() == at::kBFloat16) {
    write_all<at::BFloat16>(key_cache, value_cache, scales, rows, num_rows);
  } else {
    write_all<int8_t>(key_cache, value_cache, scales, rows, num_rows);
  }
}
