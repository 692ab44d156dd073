// A step's new K/V rows and the cache slots they go to: the checks and the row copy shared by `write_kv`
// (kv_write.cpp) and the paged decode kernel (paged_attention.cpp), which can write the rows itself.
//
// Caches hold float32, bfloat16 or int8. An int8 cache keeps one float16 scale per (slot, KV head) beside it: the row
// of D elements is `int8 * scale`, scale = max|x| / 127 (symmetric, so a zero stays exact). The scale is rounded to
// float16 first and the row quantized against the rounded value, so dequantization is exactly what was meant.

#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "isa.h"

namespace radixlm_kv {

// The longest head_dim the new rows may have when they are bfloat16 (each head's row is widened on the stack).
constexpr int64_t kMaxHeadDim = 1024;

// Row t's keys of KV head h at keys + t * stride_t + h * stride_h (D contiguous, float32, or bfloat16 when `bf16`),
// likewise its values; its slot is slots[t].
struct NewRows {
  const int64_t* slots;
  const void *keys, *values;
  int64_t key_stride_t, key_stride_h, value_stride_t, value_stride_h;
  bool bf16;
};

// The scales of an int8 cache, [num_slots, Hkv] float16: slot s, KV head h at keys[s * Hkv + h]. Null for the others.
struct Scales {
  at::Half* keys = nullptr;
  at::Half* values = nullptr;
};

// Checks that the caches are contiguous [num_slots, Hkv, D] of one shape and dtype (float32, bfloat16 or int8) and
// that int8 caches come with their scales (contiguous float16 [num_slots, Hkv]), the others without.
inline Scales check_caches(const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const c10::optional<at::Tensor>& key_scales, const c10::optional<at::Tensor>& value_scales) {
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes() && key_cache.is_contiguous() &&
                  value_cache.is_contiguous() && key_cache.scalar_type() == value_cache.scalar_type(),
              "key/value caches must be contiguous [num_slots, Hkv, D] of one shape and dtype");
  const at::ScalarType dtype = key_cache.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kChar,
              "key/value caches must be float32, bfloat16 or int8");
  TORCH_CHECK(key_scales.has_value() == value_scales.has_value(), "key_scales and value_scales go together");
  if (dtype != at::kChar) {
    TORCH_CHECK(!key_scales.has_value(), "scales go with int8 caches only");
    return {};
  }
  TORCH_CHECK(key_scales.has_value(), "int8 caches need key_scales and value_scales");
  for (const at::Tensor* scales : {&*key_scales, &*value_scales}) {
    TORCH_CHECK(scales->is_cpu() && scales->scalar_type() == at::kHalf && scales->dim() == 2 && scales->is_contiguous() &&
                    scales->size(0) == key_cache.size(0) && scales->size(1) == key_cache.size(1),
                "key/value scales must be contiguous float16 [num_slots, Hkv]");
  }
  return {key_scales->data_ptr<at::Half>(), value_scales->data_ptr<at::Half>()};
}

// Checks that keys/values are float32 or bfloat16 (both the same) [T, Hkv, D] with D contiguous and
// T = len(slot_mapping), and that every slot is inside the caches (already checked by `check_caches`).
inline NewRows check_new_rows(const at::Tensor& key_cache, const at::Tensor& slot_mapping, const at::Tensor& keys,
                              const at::Tensor& values) {
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous 1-D int64");
  const bool bf16 = keys.scalar_type() == at::kBFloat16;
  TORCH_CHECK(!bf16 || key_cache.size(2) <= kMaxHeadDim, "bfloat16 keys/values need head_dim <= ", kMaxHeadDim);
  for (const at::Tensor* rows : {&keys, &values}) {
    TORCH_CHECK(rows->dim() == 3 && rows->scalar_type() == (bf16 ? at::kBFloat16 : at::kFloat) &&
                    rows->size(0) == slot_mapping.size(0) && rows->size(1) == key_cache.size(1) &&
                    rows->size(2) == key_cache.size(2) && rows->stride(2) == 1,
                "keys/values must be float32 or bfloat16 (both the same) [T, Hkv, D] with T = len(slot_mapping) and "
                "D contiguous");
  }
  const int64_t num_slots = key_cache.size(0);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < slot_mapping.size(0); ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " outside the cache's ", num_slots);
  }
  return {slots, keys.data_ptr(), values.data_ptr(), keys.stride(0), keys.stride(1), values.stride(0),
          values.stride(1), bf16};
}

// A float16 scale as float32: one F16C instruction where the build has it (c10::Half's own conversion, without
// PyTorch's CPU_CAPABILITY macros, is a dozen integer operations: it tripled the int8 kernel's time).
inline float scale_value(at::Half scale) {
#if defined(__F16C__)
  return _cvtsh_ss(scale.x);
#else
  return static_cast<float>(scale);
#endif
}

// dst[e] = src[e] for `n` elements.
inline void store_row(float* dst, const float* src, int64_t n, at::Half*) {
  std::memcpy(dst, src, n * sizeof(float));
}

// The same into bfloat16, rounding as PyTorch's .to() does (to nearest, ties to even).
inline void store_row(at::BFloat16* dst, const float* src, int64_t n, at::Half*) {
  for (int64_t e = 0; e < n; ++e) dst[e] = c10::BFloat16(src[e]);
}

// The same into int8 with its scale (see the top of this file), as the torch reference
// (radixlm.model.kv_cache.quantize_rows) computes it: division, clamp to +-127, rounding to nearest even.
inline void store_row(int8_t* dst, const float* src, int64_t n, at::Half* scale) {
  float absmax = 0.f;
#pragma omp simd reduction(max : absmax)
  for (int64_t e = 0; e < n; ++e) absmax = std::max(absmax, std::fabs(src[e]));
  const at::Half stored(absmax / 127.f);
  *scale = stored;
  const float s = scale_value(stored);
  const float divisor = s > 0.f && std::isfinite(s) ? s : 1.f;  // an all-zero row, or one past float16's range
  for (int64_t e = 0; e < n; ++e) {
    const float q = std::fmin(std::fmax(src[e] / divisor, -127.f), 127.f);  // fmax/fmin also turn a NaN into -127
    dst[e] = static_cast<int8_t>(std::nearbyint(q));
  }
}

// One new row of `n` elements as float32: `src` itself, or its bfloat16 values widened into `buffer`.
inline const float* row_values(const void* src, int64_t offset, int64_t n, bool bf16, float* buffer) {
  if (!bf16) return static_cast<const float*>(src) + offset;
  const at::BFloat16* row = static_cast<const at::BFloat16*>(src) + offset;
  for (int64_t e = 0; e < n; ++e) buffer[e] = static_cast<float>(row[e]);
  return buffer;
}

// Writes one head's row of `n` new values (float32, or bfloat16 when `bf16`) into the cache as store_row does: a
// bfloat16 row into a bfloat16 cache is copied as it is (rounding it again would change nothing).
template <typename scalar_t>
inline void store_new_row(scalar_t* dst, const void* src, int64_t offset, int64_t n, bool bf16, at::Half* scale) {
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (bf16) {
      std::memcpy(dst, static_cast<const at::BFloat16*>(src) + offset, n * sizeof(at::BFloat16));
      return;
    }
  }
  float buffer[kMaxHeadDim];
  store_row(dst, row_values(src, offset, n, bf16, buffer), n, scale);
}

// Writes KV heads [h0, h1) of row t into the caches (`num_kv_heads` heads of `head_dim` per slot) and, for int8
// caches, their scales.
template <typename scalar_t>
inline void write_row(scalar_t* key_cache, scalar_t* value_cache, const Scales& scales, const NewRows& rows,
                      int64_t t, int64_t h0, int64_t h1, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t scale_offset = rows.slots[t] * num_kv_heads, slot_offset = scale_offset * head_dim;
  for (int64_t h = h0; h < h1; ++h) {
    at::Half* key_scale = scales.keys != nullptr ? scales.keys + scale_offset + h : nullptr;
    at::Half* value_scale = scales.values != nullptr ? scales.values + scale_offset + h : nullptr;
    store_new_row(key_cache + slot_offset + h * head_dim, rows.keys, t * rows.key_stride_t + h * rows.key_stride_h,
                  head_dim, rows.bf16, key_scale);
    store_new_row(value_cache + slot_offset + h * head_dim, rows.values,
                  t * rows.value_stride_t + h * rows.value_stride_h, head_dim, rows.bf16, value_scale);
  }
}

}  // namespace radixlm_kv
