// Writing a step's new K/V rows into the paged caches: cache[slot_mapping[t]] = rows[t] for the keys and values.
//
// PyTorch's index_copy_ does this too, but each call pays for TensorIterator set-up and a parallel region: about 6
// to 30 microseconds, twice per layer, against a fraction of that for the bytes themselves (a few kilobytes at
// decode). One plain loop for both caches on the calling thread is what the work needs.

#include <torch/library.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

namespace {

// dst[e] = src[e] for `n` elements, rounding float32 to bfloat16 as PyTorch's .to() does (to nearest, ties to even).
inline void store_row(float* dst, const float* src, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

inline void store_row(at::BFloat16* dst, const float* src, int64_t n) {
  for (int64_t e = 0; e < n; ++e) dst[e] = c10::BFloat16(src[e]);
}

template <typename scalar_t>
void write_rows(at::Tensor& cache, const int64_t* slots, const at::Tensor& rows) {
  const int64_t num_rows = rows.size(0), num_heads = rows.size(1), head_dim = rows.size(2);
  scalar_t* base = cache.data_ptr<scalar_t>();
  const float* src = rows.data_ptr<float>();
  for (int64_t t = 0; t < num_rows; ++t) {
    scalar_t* dst = base + slots[t] * num_heads * head_dim;
    for (int64_t h = 0; h < num_heads; ++h) {
      store_row(dst + h * head_dim, src + t * rows.stride(0) + h * rows.stride(1), head_dim);
    }
  }
}

void write_kv(at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& slot_mapping, const at::Tensor& keys,
              const at::Tensor& values) {
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes() && key_cache.is_contiguous() &&
                  value_cache.is_contiguous() && key_cache.scalar_type() == value_cache.scalar_type(),
              "key/value caches must be contiguous [num_slots, Hkv, D] of one shape and dtype");
  TORCH_CHECK(key_cache.scalar_type() == at::kFloat || key_cache.scalar_type() == at::kBFloat16,
              "key/value caches must be float32 or bfloat16");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous 1-D int64");
  const int64_t num_slots = key_cache.size(0);
  for (const at::Tensor* rows : {&keys, &values}) {
    TORCH_CHECK(rows->dim() == 3 && rows->scalar_type() == at::kFloat && rows->size(0) == slot_mapping.size(0) &&
                    rows->size(1) == key_cache.size(1) && rows->size(2) == key_cache.size(2) && rows->stride(2) == 1,
                "keys/values must be float32 [T, Hkv, D] with T = len(slot_mapping) and D contiguous");
  }
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < slot_mapping.size(0); ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " outside the cache's ", num_slots);
  }
  if (key_cache.scalar_type() == at::kFloat) {
    write_rows<float>(key_cache, slots, keys);
    write_rows<float>(value_cache, slots, values);
  } else {
    write_rows<at::BFloat16>(key_cache, slots, keys);
    write_rows<at::BFloat16>(value_cache, slots, values);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("write_kv(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping, Tensor keys, Tensor values) "
        "-> ()");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("write_kv", &write_kv); }
