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
// (as plain inline functions the 2,000-token kernel ran 13% slower). Include this header from one file only.
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

// Row r's online softmax step over block b: its probabilities (bfloat16 pairs), running max and sum, and the factor
// its output so far is scaled by. The sum is kept as 16 lanes (summed once, at the end: w.row_sum), and the max is
// reduced across lanes only when some score passes the running max (most blocks of a long row pass none).
RADIXLM_AVX512_BF16 inline void block_softmax(const Problem& p, Scratch& w, int64_t r, int64_t position, int64_t b) {
  float* s = w.scores.data() + r * kKeys;
  if (p.softcap > 0.f) {
    for (int64_t c = 0; c < kKeys; ++c) s[c] = std::tanh(s[c] * p.scale / p.softcap) * p.softcap;
  }
  const float scale = p.softcap > 0.f ? 1.f : p.scale;
  const int64_t first_key = p.first_key(position);
  // A block the row sees whole (most of a long prompt's) needs no mask.
  const bool whole = b * kKeys >= first_key && b * kKeys + kKeys - 1 <= position;
  const __m512i lane = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(b * kKeys)),
                                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i lo = _mm512_set1_epi32(static_cast<int>(first_key));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(position));
  const float old_max = w.max[r];
  const __m512 old_max_lanes = _mm512_set1_ps(old_max);
  __m512 x[kKeyVecs];
  __mmask16 valid[kKeyVecs];
  __mmask16 above = 0;
  for (int c = 0; c < kKeyVecs; ++c) {
    const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * c));
    valid[c] = whole ? __mmask16{0xFFFF} : _mm512_cmpge_epi32_mask(key, lo) & _mm512_cmple_epi32_mask(key, hi);
    x[c] = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * c), _mm512_set1_ps(scale));
    above |= _mm512_mask_cmp_ps_mask(valid[c], x[c], old_max_lanes, _CMP_GT_OQ);
  }
  float new_max = old_max;
  if (above != 0) {
    __m512 shown_max = old_max_lanes;
    for (int c = 0; c < kKeyVecs; ++c) shown_max = _mm512_mask_max_ps(shown_max, valid[c], shown_max, x[c]);
    new_max = _mm512_reduce_max_ps(shown_max);
  }
  if (new_max == -std::numeric_limits<float>::infinity()) {  // nothing seen yet: no probability, nothing to scale
    std::memset(w.probs.data() + r * kKeys / 2, 0, kKeys * 2);
    w.alpha[r] = 1.f;
    return;
  }
  __m512 e[kKeyVecs];
  __m512 total = _mm512_setzero_ps();
  constexpr float kLog2e = 1.44269504088896341f;
  const __m512 log2e = _mm512_set1_ps(kLog2e), shift = _mm512_set1_ps(new_max * kLog2e);
  for (int c = 0; c < kKeyVecs; ++c) {  // exp(x - max) as 2^(x log2(e) - max log2(e))
    e[c] = _mm512_maskz_mov_ps(valid[c], exp2_probability(_mm512_fmsub_ps(x[c], log2e, shift)));
    total = _mm512_add_ps(total, e[c]);
  }
  // Once the running max settles (most blocks of a long row) the factor is exp(0) = 1: no call.
  const float alpha = old_max == -std::numeric_limits<float>::infinity() ? 0.f
                      : old_max == new_max                               ? 1.f
                                                                         : std::exp(old_max - new_max);
  w.alpha[r] = alpha;
  w.max[r] = new_max;
  float* sum = w.sum.data() + r * 16;
  _mm512_storeu_ps(sum, _mm512_fmadd_ps(_mm512_loadu_ps(sum), _mm512_set1_ps(alpha), total));
  for (int c = 0; c < kKeyVecs; c += 2) {
    const __m512bh packed = _mm512_cvtne2ps_pbh(e[c + 1], e[c]);  // keys 16c .. 16c + 15, then the next 16
    _mm512_storeu_si512(w.probs.data() + r * kKeys / 2 + 8 * c, reinterpret_cast<__m512i>(packed));
  }
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

// The same two steps on AMX tiles (amx_tiles.h's configuration, loaded by the calling thread), one group of 16 rows
// at a time: a group past the item's last row computes on whatever its scratch holds and is never read. The packed
// layouts are already the tiles' operands: a key block's pair lines are B for q . k (16 keys a tile, lines 256
// bytes apart) and a value block's key-pair lines B for probs . v (16 dimensions a tile, lines 4 D bytes apart).
// Needs D a multiple of 32 (an operand tile's 16 pairs). Tiles: products 0-3, A 4, B 5-7.

// scores[r, 0 .. kKeys) = q[r] . k[block's keys] for the 16 rows from r0, in four 16 x 16 products.
RADIXLM_AMX inline void amx_group_scores(const Problem& p, Scratch& w, int64_t r0, const uint32_t* kblock) {
  const int64_t half = p.head_dim / 2;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i0 = 0; i0 < half; i0 += 16) {
    const uint32_t* k = kblock + i0 * kKeys;
    _tile_loadd(4, w.q.data() + r0 * half + i0, half * 4);
    _tile_loadd(5, k, kKeys * 4);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, k + 16, kKeys * 4);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, k + 32, kKeys * 4);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, k + 48, kKeys * 4);
    _tile_dpbf16ps(3, 4, 5);
  }
  float* s = w.scores.data() + r0 * kKeys;
  _tile_stored(0, s, kKeys * 4);
  _tile_stored(1, s + 16, kKeys * 4);
  _tile_stored(2, s + 32, kKeys * 4);
  _tile_stored(3, s + 48, kKeys * 4);
}

// out[r0 .. r0 + 16, d0 .. d0 + 16 kTiles) += probs[r0 .. r0 + 16] . v[block][:, d0 ..]: the output rows are the
// product tiles themselves, loaded and stored back.
template <int kTiles>
RADIXLM_AMX inline void amx_values_part(const Problem& p, Scratch& w, int64_t r0, int64_t d0,
                                        const uint32_t* vblock) {
  const int64_t d = p.head_dim;
  float* out = w.out.data() + r0 * d + d0;
  _tile_loadd(0, out, d * 4);
  _tile_loadd(1, out + 16, d * 4);
  if constexpr (kTiles == 4) {
    _tile_loadd(2, out + 32, d * 4);
    _tile_loadd(3, out + 48, d * 4);
  }
  for (int64_t pair0 = 0; pair0 < kKeys / 2; pair0 += 16) {
    const uint32_t* v = vblock + pair0 * d + d0;
    _tile_loadd(4, w.probs.data() + r0 * kKeys / 2 + pair0, kKeys * 2);
    _tile_loadd(5, v, d * 4);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, v + 16, d * 4);
    _tile_dpbf16ps(1, 4, 6);
    if constexpr (kTiles == 4) {
      _tile_loadd(7, v + 32, d * 4);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, v + 48, d * 4);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, out, d * 4);
  _tile_stored(1, out + 16, d * 4);
  if constexpr (kTiles == 4) {
    _tile_stored(2, out + 32, d * 4);
    _tile_stored(3, out + 48, d * 4);
  }
}

// out[r] = alpha[r] * out[r] + probs[r] . v[block] for the 16 rows from r0 (those before `end` real): the rows
// whose factor is not 1 (a running max that moved: few blocks of a long row) scaled first, then the products.
RADIXLM_AMX inline void amx_group_values(const Problem& p, Scratch& w, int64_t r0, int64_t end,
                                         const uint32_t* vblock) {
  for (int64_t r = r0; r < end; ++r) {
    if (w.alpha[r] == 1.f) continue;
    const __m512 alpha = _mm512_set1_ps(w.alpha[r]);
    float* out = w.out.data() + r * p.head_dim;
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += 16) {
      _mm512_storeu_ps(out + d0, _mm512_mul_ps(_mm512_loadu_ps(out + d0), alpha));
    }
  }
  for (int64_t d0 = 0; d0 < p.head_dim; d0 += 64) {
    if (p.head_dim - d0 >= 64) {
      amx_values_part<4>(p, w, r0, d0, vblock);
    } else {
      amx_values_part<2>(p, w, r0, d0, vblock);
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

// Key block b (its packed keys and values) against the item's `rows` rows on the tiles, each 16-row group through
// scores, softmax and values before the next, so that its scratch stays in L1; row r sits at position(r).
template <typename Position>
RADIXLM_AMX inline void amx_block(const Problem& p, Scratch& w, int64_t rows, int64_t b, const uint32_t* kblock,
                                  const uint32_t* vblock, Position position) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t end = std::min(rows, r0 + 16);
    amx_group_scores(p, w, r0, kblock);
    for (int64_t r = r0; r < end; ++r) block_softmax(p, w, r, position(r), b);
    amx_group_values(p, w, r0, end, vblock);
  }
}

}  // namespace

}  // namespace radixlm_prefill
