// The block steps of the AVX-512 BF16 prefill attention (prefill_attention.cpp): one block of 64 keys against a
// work item's query rows, flash-attention style (scores, online softmax, probabilities times values), with the
// layouts the keys and values are packed in (see the .cpp file's header comment).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../isa.h"

namespace radixlm_prefill {

constexpr int64_t kKeys = 64;         // keys per block
constexpr int kKeyVecs = kKeys / 16;  // 16-lane score vectors per row and block
constexpr int64_t kMaxRows = 64;      // query rows per work item (positions x the query heads of one KV head)

struct Rows {  // a [n, heads, D] bfloat16 tensor's data and its first two strides (elements)
  uint16_t* data;
  int64_t s0, s1;
  uint16_t* at(int64_t i, int64_t h) const { return data + i * s0 + h * s1; }
};

// What every work item of a call shares: the step's query and output rows, the head layout, the softmax's
// parameters, and the packed key/value blocks (block g of KV head h at index h * num_groups + g: a head's blocks
// in a row, as an item walks them).
struct Problem {
  Rows q, out;
  int64_t num_kv_heads, rep, head_dim, num_groups;
  float scale, softcap;
  int64_t window;  // 0: every earlier key
  bool tiles;      // scores and values on AMX tiles (amx_group_scores, amx_group_values), else the dot product
  const uint32_t* kp;
  const uint32_t* vp;
  int64_t first_key(int64_t position) const { return window > 0 ? std::max<int64_t>(0, position - window + 1) : 0; }
  const uint32_t* key_block(int64_t g, int64_t h) const { return kp + (h * num_groups + g) * head_dim / 2 * kKeys; }
  const uint32_t* value_block(int64_t g, int64_t h) const {
    return vp + (h * num_groups + g) * (kKeys / 2) * head_dim;
  }
};

struct Scratch {  // one thread's, for one item at a time; `rows` a multiple of 16 (the tiles' row groups)
  std::vector<uint32_t> q, probs;
  std::vector<float> scores, out, max, sum, alpha;  // sum: 16 lanes a row
  explicit Scratch(int64_t rows, int64_t head_dim)
      : q(rows * head_dim / 2), probs(rows * kKeys / 2), scores(rows * kKeys), out(rows * head_dim), max(rows),
        sum(rows * 16), alpha(rows) {}
};

// Internal linkage: with it GCC inlines these steps into the item loop as it did when they lived in the .cpp file
// (as plain inline functions the 2,000-token kernel ran 13% slower). Each file that includes it gets its own copy.
namespace {

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// 2^t for t <= 0 (or a rounding above it) to about 7.5e-5 relative: a degree-3 polynomial on t's fraction, scaled by
// 2^round(t). The probabilities it gives are rounded to bfloat16 (2e-3 relative) before they weigh the values, so
// exp16_nonpositive's degree-6 polynomial (~2 ulp), which the decode kernel's float32 path needs, buys nothing here,
// and its extra steps were a quarter of the softmax. Inputs below -126 count as -126 (2^-126, where 0 was exact).
RADIXLM_AVX512_BF16 inline __m512 exp2_probability(__m512 t) {
  t = _mm512_max_ps(_mm512_set1_ps(-126.f), t);  // this order keeps a NaN (maxps returns its second operand then)
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);  // in [-0.5, 0.5]
  __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(0.0551716685f), f, _mm512_set1_ps(0.242611155f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.693260968f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.999928057f));
  return _mm512_scalef_ps(y, n);
}

// scores[r, 0 .. kKeys) = q[r] . k[block's keys] for kRows rows from `r0`.
template <int kRows>
RADIXLM_AVX512_BF16 inline void block_scores(const Problem& p, Scratch& w, int64_t r0, const uint32_t* kblock) {
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

// How far a score may pass a row's running max before the max is raised (natural units: 2^8). Below it the
// probabilities exp(x - max) stay under 256, which float32 sums and bfloat16 probabilities hold with their usual
// relative precision, and a row's output is rescaled a few times over a long context instead of at nearly every
// step of its first blocks (with the output on the tiles each rescale is a store and a reload of them).
constexpr float kMaxSlack = 8 * 0.693147180559945f;

// Row r's probabilities exp(x - max) for the 16 kVecs keys of x (lanes outside `valid` 0) into its row of w.probs
// (bfloat16 pairs), and their sum into its 16 lanes of w.sum after scaling those by alpha.
template <int kVecs>
RADIXLM_AVX512_BF16 inline void emit_probabilities(Scratch& w, int64_t r, const __m512* x, const __mmask16* valid,
                                                   float max, float alpha) {
  constexpr float kLog2e = 1.44269504088896341f;
  const __m512 log2e = _mm512_set1_ps(kLog2e), shift = _mm512_set1_ps(max * kLog2e);
  __m512 e[kVecs];
  __m512 total = _mm512_setzero_ps();
  for (int c = 0; c < kVecs; ++c) {  // exp(x - max) as 2^(x log2(e) - max log2(e))
    e[c] = _mm512_maskz_mov_ps(valid[c], exp2_probability(_mm512_fmsub_ps(x[c], log2e, shift)));
    total = _mm512_add_ps(total, e[c]);
  }
  float* sum = w.sum.data() + r * 16;
  _mm512_storeu_ps(sum, _mm512_fmadd_ps(_mm512_loadu_ps(sum), _mm512_set1_ps(alpha), total));
  for (int c = 0; c < kVecs; c += 2) {
    const __m512bh packed = _mm512_cvtne2ps_pbh(e[c + 1], e[c]);  // keys 16c .. 16c + 15, then the next 16
    _mm512_storeu_si512(w.probs.data() + r * kVecs * 8 + 8 * c, reinterpret_cast<__m512i>(packed));
  }
}

// Row r's online softmax step over the 16 kVecs keys from key0 (a block of kKeys, or half of one): its probabilities
// (bfloat16 pairs), running max and sum, and the factor its output so far is scaled by. Its scores and probabilities
// sit in rows of that many keys. The sum is kept as 16 lanes (summed once, at the end: w.row_sum), and the max is
// reduced across lanes only when some score passes the running max by kMaxSlack (few steps of a row do).
template <int kVecs = kKeyVecs>
RADIXLM_AVX512_BF16 inline void block_softmax(const Problem& p, Scratch& w, int64_t r, int64_t position,
                                              int64_t key0) {
  constexpr int64_t kStep = 16 * kVecs;
  float* s = w.scores.data() + r * kStep;
  if (p.softcap > 0.f) {
    for (int64_t c = 0; c < kStep; ++c) s[c] = std::tanh(s[c] * p.scale / p.softcap) * p.softcap;
  }
  const float scale = p.softcap > 0.f ? 1.f : p.scale;
  const int64_t first_key = p.first_key(position);
  // A step the row sees whole (most of a long prompt's) needs no mask.
  const bool whole = key0 >= first_key && key0 + kStep - 1 <= position;
  const __m512i lane = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(key0)),
                                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i lo = _mm512_set1_epi32(static_cast<int>(first_key));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(position));
  const float old_max = w.max[r];
  const __m512 old_max_lanes = _mm512_set1_ps(old_max), raise_at = _mm512_set1_ps(old_max + kMaxSlack);
  __m512 x[kVecs];
  __mmask16 valid[kVecs];
  __mmask16 above = 0;
  for (int c = 0; c < kVecs; ++c) {
    const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * c));
    valid[c] = whole ? __mmask16{0xFFFF} : _mm512_cmpge_epi32_mask(key, lo) & _mm512_cmple_epi32_mask(key, hi);
    x[c] = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * c), _mm512_set1_ps(scale));
    above |= _mm512_mask_cmp_ps_mask(valid[c], x[c], raise_at, _CMP_GT_OQ);
  }
  float new_max = old_max;
  if (above != 0) {
    __m512 shown_max = old_max_lanes;
    for (int c = 0; c < kVecs; ++c) shown_max = _mm512_mask_max_ps(shown_max, valid[c], shown_max, x[c]);
    new_max = _mm512_reduce_max_ps(shown_max);
  }
  if (new_max == -std::numeric_limits<float>::infinity()) {  // nothing seen yet: no probability, nothing to scale
    std::memset(w.probs.data() + r * kStep / 2, 0, kStep * 2);
    w.alpha[r] = 1.f;
    return;
  }
  // Once the running max settles (most steps of a long row) the factor is exp(0) = 1: no call. A row that saw no key
  // before has an output of zeros, which needs no scaling either.
  const float alpha = old_max == -std::numeric_limits<float>::infinity() ? 1.f
                      : old_max == new_max                               ? 1.f
                                                                         : std::exp(old_max - new_max);
  w.alpha[r] = alpha;
  w.max[r] = new_max;
  emit_probabilities<kVecs>(w, r, x, valid, new_max, alpha);
}

// block_softmax for rows r0 .. end - 1 over a step of 16 kVecs keys that every one of them sees whole, with no softcap
// (`sees_whole`; most steps of a long prompt): its work without the masks and branches, in one loop.
template <int kVecs>
RADIXLM_AVX512_BF16 inline void whole_step_softmax(const Problem& p, Scratch& w, int64_t r0, int64_t end) {
  constexpr int64_t kStep = 16 * kVecs;
  const __m512 scale = _mm512_set1_ps(p.scale);
  __mmask16 all[kVecs];
  std::fill_n(all, kVecs, __mmask16{0xFFFF});
  for (int64_t r = r0; r < end; ++r) {
    const float* s = w.scores.data() + r * kStep;
    __m512 x[kVecs];
    for (int c = 0; c < kVecs; ++c) x[c] = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * c), scale);
    __m512 top = x[0];
    for (int c = 1; c < kVecs; ++c) top = _mm512_max_ps(top, x[c]);
    const float old_max = w.max[r];
    float new_max = old_max, alpha = 1.f;
    if (_mm512_cmp_ps_mask(top, _mm512_set1_ps(old_max + kMaxSlack), _CMP_GT_OQ) != 0) {
      new_max = std::max(old_max, _mm512_reduce_max_ps(top));
      if (old_max != -std::numeric_limits<float>::infinity()) alpha = std::exp(old_max - new_max);
      w.max[r] = new_max;
    }
    w.alpha[r] = alpha;
    if (new_max == -std::numeric_limits<float>::infinity()) {  // NaN scores only: nothing seen yet
      std::memset(w.probs.data() + r * kStep / 2, 0, kStep * 2);
      continue;
    }
    emit_probabilities<kVecs>(w, r, x, all, new_max, alpha);
  }
}

// Whether rows r0 .. end - 1 (positions growing with the rows, and so the first key a window lets them see) all see
// the `num_keys` keys from key0, with no softcap: whole_step_softmax's case.
template <typename Position>
inline bool sees_whole(const Problem& p, int64_t r0, int64_t end, int64_t key0, int64_t num_keys, Position position) {
  return p.softcap == 0.f && key0 >= p.first_key(position(end - 1)) && key0 + num_keys - 1 <= position(r0);
}

// Row r's softmax denominator: its 16 lanes of sums added.
RADIXLM_AVX512_BF16 inline float row_sum(const Scratch& w, int64_t r) {
  return _mm512_reduce_add_ps(_mm512_loadu_ps(w.sum.data() + r * 16));
}

// out[r, d0 .. d0 + 16 kVecs) = alpha[r] * out[r, ...] + probs[r] . v[block] for kRows rows from r0.
template <int kRows, int kVecs>
RADIXLM_AVX512_BF16 inline void block_values(const Problem& p, Scratch& w, int64_t r0, int64_t d0, const uint32_t* vblock) {
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
RADIXLM_AVX512_BF16 inline void row_tile(const Problem& p, Scratch& w, int64_t r0, const uint32_t* vblock) {
  for (int64_t d0 = 0; d0 < p.head_dim; d0 += 64) {
    switch (std::min<int64_t>(4, (p.head_dim - d0) / 16)) {
      case 4: block_values<kRows, 4>(p, w, r0, d0, vblock); break;
      case 3: block_values<kRows, 3>(p, w, r0, d0, vblock); break;
      case 2: block_values<kRows, 2>(p, w, r0, d0, vblock); break;
      default: block_values<kRows, 1>(p, w, r0, d0, vblock); break;
    }
  }
}

// Readies w for an item's `rows` query rows, already in w.q: the tiles' padding rows (to the next 16) scored as zeros,
// the outputs, maxima and sums cleared.
inline void begin_rows(const Problem& p, Scratch& w, int64_t rows) {
  const int64_t half = p.head_dim / 2, tile_rows = (rows + 15) / 16 * 16;
  if (p.tiles) std::fill(w.q.data() + rows * half, w.q.data() + tile_rows * half, 0u);
  std::fill_n(w.out.begin(), rows * p.head_dim, 0.f);
  std::fill_n(w.max.begin(), rows, -std::numeric_limits<float>::infinity());
  std::fill_n(w.sum.begin(), rows * 16, 0.f);
}

}  // namespace

}  // namespace radixlm_prefill
