// Paged decode attention on CPU: one call per layer for every decoding request.
//
// Each request has one query row; its context is read in place through its block table (slot = block * block_size
// + offset), so shared prefixes and scattered blocks cost nothing extra. Work items are (request, KV head) pairs,
// spread over OpenMP threads; each K/V row is read once for all the query heads that share it (GQA) and the
// softmax is computed online in one pass over the context, tile by tile. Storage may be float32 or bfloat16;
// arithmetic is float32. The inner loops are plain C++ that -O3 and the host ISA vectorise.

#include <Python.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kTile = 32;  // positions scored before each softmax rescale

inline void load_row(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void load_row(const at::BFloat16* src, float* dst, int64_t n) {
  // bfloat16 is the top half of a float32: widen by shifting the bits (vectorises to a zero-extend + shift).
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
    float value;
    std::memcpy(&value, &wide, sizeof(value));
    dst[i] = value;
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

struct Problem {
  const float* query;  // [B, Hq, D] contiguous
  float* out;          // [B, Hq, D] contiguous
  const int32_t* block_table;    // flat: the blocks of request b start at block_offsets[b]
  const int32_t* block_offsets;  // [B]
  const int32_t* context_lens;   // [B]
  int64_t num_heads, num_kv_heads, head_dim, block_size, sliding_window;
  float scale, softcap;
};

// Attention of the `rep` query heads of KV head `h` of request `b` over its context.
template <typename scalar_t>
void attend_one(const Problem& p, const scalar_t* key_cache, const scalar_t* value_cache, int64_t b, int64_t h,
                std::vector<float>& scratch) {
  const int64_t rep = p.num_heads / p.num_kv_heads, d = p.head_dim;
  const int64_t context_len = p.context_lens[b];
  const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, context_len - p.sliding_window) : 0;
  const int32_t* blocks = p.block_table + p.block_offsets[b];
  const float* q = p.query + (b * p.num_heads + h * rep) * d;  // the rep heads are consecutive rows
  float* out = p.out + (b * p.num_heads + h * rep) * d;

  scratch.resize(rep * d + rep * kTile + kTile * d + 2 * rep);
  float* acc = scratch.data();              // [rep, D]
  float* scores = acc + rep * d;            // [rep, kTile]
  float* rows = scores + rep * kTile;       // [kTile, D] K (then V) rows of the tile as float32
  float* running_max = rows + kTile * d;    // [rep]
  float* running_sum = running_max + rep;   // [rep]
  std::fill(acc, acc + rep * d, 0.f);
  std::fill(running_max, running_max + rep, -std::numeric_limits<float>::infinity());
  std::fill(running_sum, running_sum + rep, 0.f);
  const int64_t row_stride = p.num_kv_heads * d;
  int64_t slots[kTile];

  for (int64_t start = first; start < context_len; start += kTile) {
    const int64_t n = std::min(kTile, context_len - start);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = start + i;
      slots[i] = static_cast<int64_t>(blocks[pos / p.block_size]) * p.block_size + pos % p.block_size;
      load_row(key_cache + slots[i] * row_stride + h * d, rows + i * d, d);
    }
    for (int64_t r = 0; r < rep; ++r) {
      float* s = scores + r * kTile;
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        float logit = dot(q + r * d, rows + i * d, d) * p.scale;
        if (p.softcap > 0.f) logit = std::tanh(logit / p.softcap) * p.softcap;
        s[i] = logit;
        tile_max = std::max(tile_max, logit);
      }
      const float new_max = std::max(running_max[r], tile_max);
      const float correction = std::exp(running_max[r] - new_max);  // 0 on the first tile (exp(-inf))
      float tile_sum = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        s[i] = std::exp(s[i] - new_max);
        tile_sum += s[i];
      }
      running_sum[r] = running_sum[r] * correction + tile_sum;
      running_max[r] = new_max;
      float* a = acc + r * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) a[j] *= correction;
    }
    for (int64_t i = 0; i < n; ++i) load_row(value_cache + slots[i] * row_stride + h * d, rows + i * d, d);
    for (int64_t r = 0; r < rep; ++r) {
      float* a = acc + r * d;
      const float* s = scores + r * kTile;
      for (int64_t i = 0; i < n; ++i) {
        const float weight = s[i];
        const float* v = rows + i * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) a[j] += weight * v[j];
      }
    }
  }
  for (int64_t r = 0; r < rep; ++r) {
    const float inverse = running_sum[r] > 0.f ? 1.f / running_sum[r] : 0.f;  // empty context: zeros
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = acc[r * d + j] * inverse;
  }
}

template <typename scalar_t>
void run(const Problem& p, const at::Tensor& key_cache, const at::Tensor& value_cache, int64_t batch) {
  const scalar_t* keys = key_cache.data_ptr<scalar_t>();
  const scalar_t* values = value_cache.data_ptr<scalar_t>();
  const int64_t num_items = batch * p.num_kv_heads;
  // Dynamic scheduling: contexts differ in length, so equal static shares would leave a thread idle.
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      attend_one<scalar_t>(p, keys, values, item / p.num_kv_heads, item % p.num_kv_heads, scratch);
    }
  }
}

at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& block_table, const at::Tensor& block_offsets,
                                  const at::Tensor& context_lens, int64_t block_size, double scale,
                                  int64_t sliding_window, double softcap) {
  TORCH_CHECK(query.dim() == 3 && query.scalar_type() == at::kFloat, "query must be float32 [B, Hq, D]");
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes(),
              "key/value caches must be [num_slots, Hkv, D] of one shape");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type() &&
                  (key_cache.scalar_type() == at::kFloat || key_cache.scalar_type() == at::kBFloat16),
              "key/value caches must both be float32 or both bfloat16");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "key/value caches must be contiguous");
  TORCH_CHECK(key_cache.size(2) == query.size(2), "head_dim of the query and the cache differ");
  const int64_t batch = query.size(0), num_heads = query.size(1), num_kv_heads = key_cache.size(1);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads");
  for (const at::Tensor* t : {&block_table, &block_offsets, &context_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kInt && t->dim() == 1 && t->is_contiguous(),
                "block_table, block_offsets and context_lens must be contiguous 1-D int32");
  }
  TORCH_CHECK(block_offsets.size(0) == batch && context_lens.size(0) == batch, "one offset and length per row");
  TORCH_CHECK(block_size > 0, "block_size must be positive");
  const at::Tensor q = query.contiguous();
  at::Tensor out = at::empty_like(q);
  Problem p{q.data_ptr<float>(), out.data_ptr<float>(), block_table.data_ptr<int32_t>(),
            block_offsets.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(), num_heads, num_kv_heads,
            q.size(2), block_size, sliding_window, static_cast<float>(scale), static_cast<float>(softcap)};
  if (key_cache.scalar_type() == at::kFloat) {
    run<float>(p, key_cache, value_cache, batch);
  } else {
    run<at::BFloat16>(p, key_cache, value_cache, batch);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(radixlm, m) {
  m.def("paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
        "Tensor block_offsets, Tensor context_lens, int block_size, float scale, int sliding_window, "
        "float softcap) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }

// An importable module with no Python functions: importing radixlm._C runs the registrations above.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
