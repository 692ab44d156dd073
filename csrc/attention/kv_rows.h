// A step's new K/V rows and the cache slots they go to: the checks and the row copy shared by `write_kv`
// (kv_write.cpp) and the paged decode kernel (paged_attention.cpp), which can write the rows itself.

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

namespace radixlm_kv {

// Row t's keys of KV head h at keys + t * stride_t + h * stride_h (D contiguous), likewise its values; its slot is
// slots[t].
struct NewRows {
  const int64_t* slots;
  const float *keys, *values;
  int64_t key_stride_t, key_stride_h, value_stride_t, value_stride_h;
};

// Checks that the caches are contiguous [num_slots, Hkv, D] float32 or bfloat16 of one shape, that keys/values are
// float32 [T, Hkv, D] with D contiguous and T = len(slot_mapping), and that every slot is inside the caches.
inline NewRows check_new_rows(const at::Tensor& key_cache, const at::Tensor& value_cache,
                              const at::Tensor& slot_mapping, const at::Tensor& keys, const at::Tensor& values) {
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes() && key_cache.is_contiguous() &&
                  value_cache.is_contiguous() && key_cache.scalar_type() == value_cache.scalar_type(),
              "key/value caches must be contiguous [num_slots, Hkv, D] of one shape and dtype");
  TORCH_CHECK(key_cache.scalar_type() == at::kFloat || key_cache.scalar_type() == at::kBFloat16,
              "key/value caches must be float32 or bfloat16");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous 1-D int64");
  for (const at::Tensor* rows : {&keys, &values}) {
    TORCH_CHECK(rows->dim() == 3 && rows->scalar_type() == at::kFloat && rows->size(0) == slot_mapping.size(0) &&
                    rows->size(1) == key_cache.size(1) && rows->size(2) == key_cache.size(2) && rows->stride(2) == 1,
                "keys/values must be float32 [T, Hkv, D] with T = len(slot_mapping) and D contiguous");
  }
  const int64_t num_slots = key_cache.size(0);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < slot_mapping.size(0); ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " outside the cache's ", num_slots);
  }
  return {slots, keys.data_ptr<float>(), values.data_ptr<float>(), keys.stride(0), keys.stride(1), values.stride(0),
          values.stride(1)};
}

// dst[e] = src[e] for `n` elements.
inline void store_row(float* dst, const float* src, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

// The same into bfloat16, rounding as PyTorch's .to() does (to nearest, ties to even).
inline void store_row(at::BFloat16* dst, const float* src, int64_t n) {
  for (int64_t e = 0; e < n; ++e) dst[e] = c10::BFloat16(src[e]);
}

// Writes KV heads [h0, h1) of row t into the caches (`num_kv_heads` heads of `head_dim` per slot).
template <typename scalar_t>
inline void write_row(scalar_t* key_cache, scalar_t* value_cache, const NewRows& rows, int64_t t, int64_t h0,
                      int64_t h1, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t slot_offset = rows.slots[t] * num_kv_heads * head_dim;
  for (int64_t h = h0; h < h1; ++h) {
    store_row(key_cache + slot_offset + h * head_dim, rows.keys + t * rows.key_stride_t + h * rows.key_stride_h,
              head_dim);
    store_row(value_cache + slot_offset + h * head_dim,
              rows.values + t * rows.value_stride_t + h * rows.value_stride_h, head_dim);
  }
}

}  // namespace radixlm_kv
