// Causal attention over a prefill chunk with AVX-512's bfloat16 dot product (vdpbf16ps), flash-attention style.
//
// Why our own: PyTorch's CPU flash SDPA ran a 2,000-token prefill of the default model at 0.11 TFLOP/s on a Zen 4
// (2 threads, bfloat16 or float32 alike; 41.6 ms a layer, half of the prefill), where its bfloat16 matmul reaches
// 0.41. On a CPU with AMX-BF16 SDPA's tiles are faster than this loop, and radixlm/model/attention/prefill_kernel.py
// keeps SDPA there.
//
// K and V are first repacked per KV head into the dot product's pair layout (one pass, O(L)): a block of 64 keys
// holds, for each pair of dimensions, the 64 keys' pairs as 32-bit words (`kp`, so 16 keys' scores are one vector
// of dot products), and, for each pair of consecutive keys, their D values interleaved (`vp`, so the probabilities of
// two keys multiply 16 dimensions at once). A work item is a run of query positions of one KV head, with every query
// head that shares it (up to 64 rows); it walks the key blocks its rows may see with an online softmax, its scores,
// probabilities and output in float32 scratch, and writes each row once at the end.
#include "prefill_attention.h"

#include <omp.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../exp_nonpositive.h"
#include "../isa.h"

namespace {

constexpr int64_t kKeys = 64;     // keys per block
constexpr int kKeyVecs = kKeys / 16;  // 16-lane score vectors per row and block
constexpr int64_t kMaxRows = 64;  // query rows per work item (positions x the query heads of one KV head)
constexpr int64_t kSerialMacs = int64_t{1} << 20;  // below this many multiply-adds one thread runs it all

struct Rows {  // a [n, heads, D] bfloat16 tensor's data and its first two strides (elements)
  uint16_t* data;
  int64_t s0, s1;
  uint16_t* at(int64_t i, int64_t h) const { return data + i * s0 + h * s1; }
};

struct Problem {
  Rows q, k, v, out;
  int64_t num_queries, num_keys, num_kv_heads, rep, head_dim, num_blocks, positions_per_item;
  float scale, softcap;
  int64_t window;  // 0: every earlier key
  const uint32_t* kp;
  const uint32_t* vp;
  int64_t first_key(int64_t position) const { return window > 0 ? std::max<int64_t>(0, position - window + 1) : 0; }
};

struct Scratch {  // one thread's, for one item at a time
  std::vector<uint32_t> q, probs;
  std::vector<float> scores, out, max, sum, alpha;
  explicit Scratch(int64_t rows, int64_t head_dim)
      : q(rows * head_dim / 2), probs(rows * kKeys / 2), scores(rows * kKeys), out(rows * head_dim), max(rows),
        sum(rows), alpha(rows) {}
};

// Block b of KV head h in the pair layouts (zeros past the last key).
void pack_block(const Problem& p, uint32_t* kp, uint32_t* vp, int64_t h, int64_t b) {
  const int64_t half = p.head_dim / 2, d = p.head_dim;
  uint32_t* kdst = kp + (h * p.num_blocks + b) * half * kKeys;
  uint32_t* vdst = vp + (h * p.num_blocks + b) * (kKeys / 2) * d;
  for (int64_t c = 0; c < kKeys; ++c) {
    const int64_t j = b * kKeys + c;
    const uint16_t* row = j < p.num_keys ? p.k.at(j, h) : nullptr;
    for (int64_t i = 0; i < half; ++i) {
      uint32_t word = 0;
      if (row != nullptr) std::memcpy(&word, row + 2 * i, sizeof(word));
      kdst[i * kKeys + c] = word;
    }
  }
  for (int64_t pair = 0; pair < kKeys / 2; ++pair) {
    const int64_t j = b * kKeys + 2 * pair;
    const uint16_t* first = j < p.num_keys ? p.v.at(j, h) : nullptr;
    const uint16_t* second = j + 1 < p.num_keys ? p.v.at(j + 1, h) : nullptr;
    for (int64_t e = 0; e < d; ++e) {
      const uint32_t lo = first != nullptr ? first[e] : 0, hi = second != nullptr ? second[e] : 0;
      vdst[pair * d + e] = lo | (hi << 16);
    }
  }
}

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// scores[r, 0 .. kKeys) = q[r] . k[block's keys] for kRows rows from `r0`.
template <int kRows>
RADIXLM_AVX512_BF16 void block_scores(const Problem& p, Scratch& w, int64_t r0, const uint32_t* kblock) {
  const int64_t half = p.head_dim / 2;
  __m512 acc[kRows][kKeyVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kKeyVecs; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const uint32_t* q = w.q.data() + r0 * half;
  for (int64_t i = 0; i < half; ++i) {
    __m512bh keys[kKeyVecs];
    for (int c = 0; c < kKeyVecs; ++c) keys[c] = as_bh(_mm512_loadu_si512(kblock + i * kKeys + 16 * c));
    for (int r = 0; r < kRows; ++r) {
      const __m512bh qq = as_bh(_mm512_set1_epi32(static_cast<int>(q[r * half + i])));
      for (int c = 0; c < kKeyVecs; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qq, keys[c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kKeyVecs; ++c) _mm512_storeu_ps(w.scores.data() + (r0 + r) * kKeys + 16 * c, acc[r][c]);
  }
}

// Row r's online softmax step over block b: its probabilities (bfloat16 pairs), running max and sum, and the factor
// its output so far is scaled by.
RADIXLM_AVX512_BF16 void block_softmax(const Problem& p, Scratch& w, int64_t r, int64_t position, int64_t b) {
  float* s = w.scores.data() + r * kKeys;
  if (p.softcap > 0.f) {
    for (int64_t c = 0; c < kKeys; ++c) s[c] = std::tanh(s[c] * p.scale / p.softcap) * p.softcap;
  }
  const float scale = p.softcap > 0.f ? 1.f : p.scale;
  const __m512i lane = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(b * kKeys)),
                                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i lo = _mm512_set1_epi32(static_cast<int>(p.first_key(position)));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(position));
  __m512 x[kKeyVecs];
  __mmask16 valid[kKeyVecs];
  float block_max = -std::numeric_limits<float>::infinity();
  for (int c = 0; c < kKeyVecs; ++c) {
    const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * c));
    valid[c] = _mm512_cmpge_epi32_mask(key, lo) & _mm512_cmple_epi32_mask(key, hi);
    x[c] = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * c), _mm512_set1_ps(scale));
    const __m512 shown = _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), valid[c],
                                            x[c]);
    block_max = std::max(block_max, _mm512_reduce_max_ps(shown));
  }
  const float old_max = w.max[r], new_max = std::max(old_max, block_max);
  if (new_max == -std::numeric_limits<float>::infinity()) {  // nothing seen yet: no probability, nothing to scale
    std::memset(w.probs.data() + r * kKeys / 2, 0, kKeys * 2);
    w.alpha[r] = 1.f;
    return;
  }
  __m512 e[kKeyVecs];
  __m512 total = _mm512_setzero_ps();
  for (int c = 0; c < kKeyVecs; ++c) {
    e[c] = _mm512_maskz_mov_ps(valid[c], radixlm::exp16_nonpositive(
                                                   _mm512_sub_ps(x[c], _mm512_set1_ps(new_max))));
    total = _mm512_add_ps(total, e[c]);
  }
  const float alpha = old_max == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(old_max - new_max);
  w.alpha[r] = alpha;
  w.max[r] = new_max;
  w.sum[r] = w.sum[r] * alpha + _mm512_reduce_add_ps(total);
  for (int c = 0; c < kKeyVecs; c += 2) {
    const __m512bh packed = _mm512_cvtne2ps_pbh(e[c + 1], e[c]);  // keys 16c .. 16c + 15, then the next 16
    _mm512_storeu_si512(w.probs.data() + r * kKeys / 2 + 8 * c, reinterpret_cast<__m512i>(packed));
  }
}

// out[r, d0 .. d0 + 16 kVecs) = alpha[r] * out[r, ...] + probs[r] . v[block] for kRows rows from r0.
template <int kRows, int kVecs>
RADIXLM_AVX512_BF16 void block_values(const Problem& p, Scratch& w, int64_t r0, int64_t d0, const uint32_t* vblock) {
  const int64_t d = p.head_dim;
  __m512 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    const __m512 alpha = _mm512_set1_ps(w.alpha[r0 + r]);
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = _mm512_mul_ps(_mm512_loadu_ps(w.out.data() + (r0 + r) * d + d0 + 16 * v), alpha);
    }
  }
  for (int64_t pair = 0; pair < kKeys / 2; ++pair) {
    __m512bh values[kVecs];
    for (int v = 0; v < kVecs; ++v) values[v] = as_bh(_mm512_loadu_si512(vblock + pair * d + d0 + 16 * v));
    for (int r = 0; r < kRows; ++r) {
      const __m512bh prob = as_bh(_mm512_set1_epi32(static_cast<int>(w.probs[(r0 + r) * kKeys / 2 + pair])));
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], prob, values[v]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(w.out.data() + (r0 + r) * d + d0 + 16 * v, acc[r][v]);
  }
}

template <int kRows>
RADIXLM_AVX512_BF16 void row_tile(const Problem& p, Scratch& w, int64_t r0, const uint32_t* vblock) {
  for (int64_t d0 = 0; d0 < p.head_dim; d0 += 64) {
    switch (std::min<int64_t>(4, (p.head_dim - d0) / 16)) {
      case 4: block_values<kRows, 4>(p, w, r0, d0, vblock); break;
      case 3: block_values<kRows, 3>(p, w, r0, d0, vblock); break;
      case 2: block_values<kRows, 2>(p, w, r0, d0, vblock); break;
      default: block_values<kRows, 1>(p, w, r0, d0, vblock); break;
    }
  }
}

// Query positions t0 .. t0 + positions_per_item - 1 of KV head h, with all its query heads: row r is position
// t0 + r / rep of query head h * rep + r % rep.
RADIXLM_AVX512_BF16 void attend_item(const Problem& p, Scratch& w, int64_t h, int64_t t0) {
  const int64_t t1 = std::min(p.num_queries, t0 + p.positions_per_item), rows = (t1 - t0) * p.rep;
  const int64_t offset = p.num_keys - p.num_queries, half = p.head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(w.q.data() + r * half, p.q.at(t0 + r / p.rep, h * p.rep + r % p.rep), p.head_dim * 2);
  }
  std::fill_n(w.out.begin(), rows * p.head_dim, 0.f);
  std::fill_n(w.max.begin(), rows, -std::numeric_limits<float>::infinity());
  std::fill_n(w.sum.begin(), rows, 0.f);
  const int64_t first = p.first_key(offset + t0) / kKeys, last = (offset + t1 - 1) / kKeys;
  for (int64_t b = first; b <= last; ++b) {
    const uint32_t* kblock = p.kp + (h * p.num_blocks + b) * half * kKeys;
    const uint32_t* vblock = p.vp + (h * p.num_blocks + b) * (kKeys / 2) * p.head_dim;
    int64_t r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4) block_scores<4>(p, w, r0, kblock);
    for (; r0 < rows; ++r0) block_scores<1>(p, w, r0, kblock);
    for (int64_t r = 0; r < rows; ++r) block_softmax(p, w, r, offset + t0 + r / p.rep, b);
    for (r0 = 0; r0 + 4 <= rows; r0 += 4) row_tile<4>(p, w, r0, vblock);
    for (; r0 < rows; ++r0) row_tile<1>(p, w, r0, vblock);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inverse = 1.f / w.sum[r];
    uint16_t* dst = p.out.at(t0 + r / p.rep, h * p.rep + r % p.rep);
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += 16) {
      const __m512 o = _mm512_mul_ps(_mm512_loadu_ps(w.out.data() + r * p.head_dim + d0), _mm512_set1_ps(inverse));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d0), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(o)));
    }
  }
}

void check_rows(const at::Tensor& t, const char* name, int64_t head_dim) {
  TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage(), name,
              " must be a dense CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 && t.dim() == 3 && t.stride(2) == 1, name,
              " must be bfloat16 [n, heads, D] with D contiguous");
  TORCH_CHECK(t.size(2) == head_dim, name, " has head size ", t.size(2), ", query ", head_dim);
}

Rows rows_of(const at::Tensor& t) {
  return {reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()), t.stride(0), t.stride(1)};
}

}  // namespace

namespace radixlm {

bool prefill_attention_available() { return isa::cpu_has_avx512_bf16(); }

void prefill_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor& out,
                       double scale, int64_t sliding_window, double softcap) {
  TORCH_CHECK(prefill_attention_available(), "prefill_attention needs a CPU with AVX-512 BF16");
  const int64_t head_dim = query.size(-1);
  for (const auto& [t, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}, {&out, "out"}}) {
    check_rows(*t, name, head_dim);
  }
  TORCH_CHECK(head_dim % 16 == 0 && head_dim <= 512, "head size must be a multiple of 16 up to 512, got ", head_dim);
  TORCH_CHECK(out.sizes() == query.sizes() && value.sizes() == key.sizes(), "out must match query, value key");
  const int64_t num_queries = query.size(0), num_keys = key.size(0), num_kv_heads = key.size(1);
  TORCH_CHECK(num_kv_heads > 0 && query.size(1) % num_kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(num_keys >= num_queries, "the context (", num_keys, " keys) must hold the chunk's ", num_queries,
              " queries");
  TORCH_CHECK(std::isfinite(scale) && std::isfinite(softcap) && softcap >= 0 && sliding_window >= 0,
              "scale and softcap must be finite, softcap and sliding_window not negative");
  if (num_queries == 0) return;
  const int64_t rep = query.size(1) / num_kv_heads, num_blocks = (num_keys + kKeys - 1) / kKeys;
  at::Tensor kp = at::empty({num_kv_heads * num_blocks * kKeys * head_dim / 2}, at::kInt);
  at::Tensor vp = at::empty_like(kp);
  Problem p{rows_of(query), rows_of(key), rows_of(value), rows_of(out), num_queries, num_keys, num_kv_heads, rep,
            head_dim, num_blocks, std::max<int64_t>(1, kMaxRows / rep), static_cast<float>(scale),
            static_cast<float>(softcap), sliding_window, reinterpret_cast<uint32_t*>(kp.data_ptr<int32_t>()),
            reinterpret_cast<uint32_t*>(vp.data_ptr<int32_t>())};
  const int64_t num_positions_blocks = (num_queries + p.positions_per_item - 1) / p.positions_per_item;
  const int64_t num_items = num_kv_heads * num_positions_blocks;
  const int64_t macs = num_queries * num_keys * query.size(1) * head_dim;
  const int num_threads = macs < kSerialMacs ? 1 : static_cast<int>(std::min<int64_t>(at::get_num_threads(),
                                                                                       num_items));
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < num_kv_heads * num_blocks; ++k) {
      pack_block(p, const_cast<uint32_t*>(p.kp), const_cast<uint32_t*>(p.vp), k / num_blocks, k % num_blocks);
    }
    Scratch scratch(p.positions_per_item * rep, head_dim);
    // Later positions see more keys: they go first, so that the short items fill the end.
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < num_items; ++k) {
      attend_item(p, scratch, k % num_kv_heads, (num_positions_blocks - 1 - k / num_kv_heads) * p.positions_per_item);
    }
  }
}

}  // namespace radixlm
