// The int8 linear layer for up to 64 rows (decode at small batch, a decode verifying drafts, a short chunk):
// radixlm.model.quantize.Int8Linear's output, y = x W^T (+ b) with int8 W [N, K_pad] packed by tiles of rows and
// x [..., K] holding M <= kMaxInt8Rows rows. (The float32 kernel is in linear.cpp.)
//
// It reproduces PyTorch's fbgemm dynamic linear exactly as Int8Linear calls it (per-output-channel weight scales,
// per-row activations): each row is divided by its absolute maximum, quantized to uint8 with scale 2/255 and zero
// point 128 (what fbgemm chooses for the range [-1, 1]), multiplied in int32 (exact), and dequantized in the same
// float order, so a row gives bit-identical output on either path.

#include "linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "int8_rows.h"
#include "isa.h"
#include "kernel_checks.h"

namespace {

// Rows per call. Each row costs its own multiply-adds (compute), the weights are read once: on a Xeon with AVX-512
// VNNI the kernel took less time than Int8Linear's fbgemm path (kernel and the Python around it) up to about 96 rows
// (the default model's 121 linears: 24.0 against 31.3 ms at 32 rows, 45.2 against 51.9 at 64, 86.7 against 83.8 at
// 128), so up to 64 rows go through it (17 before: a decode verifying 16 drafts).
constexpr int64_t kMaxInt8Rows = 64;
constexpr int64_t kStackRows = 17;  // quantized rows kept on the stack (136 KiB); more go to the heap
constexpr int32_t kZeroPoint = 128;
constexpr int64_t kPrefetchTiles = 1;  // how far ahead (in tiles of rows) the int8 kernel asks for weights
constexpr int64_t kMaxK = 8192;  // input features of the int8 path (a quantized row's bytes)
// Weight rows per tile. The int8 weights come packed by tiles of this many rows (radixlm.model.small_batch.Int8Rows):
// within a tile, the first 64 bytes of each row, then the next 64 of each, and so on, so the kernel reads one
// sequential stream; the rows after the last whole tile stay row by row. Ranges handed to threads start on a tile.
constexpr int64_t kInt8TileRows = 8;

// Quantize row `x[0..k)` as fbgemm does for the range [-1, 1] after dividing by the row's absolute maximum.
// Returns that maximum (the row's dequantization factor). `q` gets k bytes, zero-padded to `k_pad`.
float quantize_row(const float* x, int64_t k, int64_t k_pad, uint8_t* q) {
  const float row_max = radixlm_int8::row_abs_max(x, k);  // NaN rows give NaN outputs, as on fbgemm's path
  const float scale = static_cast<float>(2.0 / 255.0);
  const float inverse_scale = 1.f / scale;
  for (int64_t i = 0; i < k; ++i) {
    const float normalized = x[i] / row_max;
    const float transformed = std::fma(normalized, inverse_scale, static_cast<float>(kZeroPoint));
    const float rounded = std::nearbyint(transformed);
    q[i] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, rounded)));
  }
  std::memset(q + k, kZeroPoint, k_pad - k);  // padding: zero after the zero-point correction below
  return row_max;
}

#if RADIXLM_BUILD_AVX512_VNNI
// The lane sums of 8 vectors as one vector of 8: a transposing tree of shuffles and adds (about 3 instructions a
// vector instead of about 10 for 8 separate horizontal sums, which dominated short rows).
inline __m256i reduce8(const __m512i* v) {
  __m512i half[4];  // lanes 0-7: v[2i]'s 8 partial sums, lanes 8-15: v[2i+1]'s
  for (int i = 0; i < 4; ++i) {
    half[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0x44),
                               _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  __m512i quarter[2];  // 128-bit lane j: the 4 partial sums of vector 4i + j
  for (int i = 0; i < 2; ++i) {
    quarter[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(half[2 * i], half[2 * i + 1], 0x88),
                                  _mm512_shuffle_i32x4(half[2 * i], half[2 * i + 1], 0xDD));
  }
  // In 128-bit lane j: [a, e, a, e] with a = sum of vector j, e = sum of vector 4 + j.
  const __m512i pairs = _mm512_add_epi32(_mm512_unpacklo_epi32(quarter[0], quarter[1]),
                                         _mm512_unpackhi_epi32(quarter[0], quarter[1]));
  const __m512i sums = _mm512_add_epi32(pairs, _mm512_shuffle_epi32(pairs, _MM_PERM_BADC));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, sums));
}
#endif

// raw[m][t] = sum_k (q[m][k] - 128) * w[t][k] for the kTileN weight rows of a packed tile at w (see kInt8TileRows:
// element (t, k) at w + (k / 64) * 64 * kTileN + t * 64 + k % 64) and kRows quantized
// rows (uint8 x int8 products summed in int32: exact, and equal to fbgemm's after its zero-point correction).
template <int64_t kRows, int64_t kTileN>
inline void int8_tile(const uint8_t (*q)[kMaxK], const int8_t* w, int64_t k_pad, const int32_t* sums,
                      int32_t (*raw)[kTileN]) {
#if RADIXLM_BUILD_AVX512_VNNI
  __m512i acc[kRows][kTileN];
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t t = 0; t < kTileN; ++t) acc[m][t] = _mm512_setzero_si512();
  }
  for (int64_t k = 0; k < k_pad; k += 64) {
    __m512i wv[kTileN];
    for (int64_t t = 0; t < kTileN; ++t) {
      // The next tile's rows, one line per line read: the rows are short, and without this the loads stall.
      __builtin_prefetch(w + kPrefetchTiles * kTileN * k_pad + k * kTileN + t * 64, 0, 2);
      wv[t] = _mm512_loadu_si512(w + k * kTileN + t * 64);
    }
    for (int64_t m = 0; m < kRows; ++m) {
      const __m512i qv = _mm512_loadu_si512(q[m] + k);
      for (int64_t t = 0; t < kTileN; ++t) acc[m][t] = _mm512_dpbusd_epi32(acc[m][t], qv, wv[t]);
    }
  }
  for (int64_t m = 0; m < kRows; ++m) {
    if constexpr (kTileN % 8 == 0) {
      for (int64_t t = 0; t < kTileN; t += 8) {
        const __m256i total = reduce8(acc[m] + t);
        const __m256i correction = _mm256_mullo_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + t)), _mm256_set1_epi32(kZeroPoint));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(raw[m] + t), _mm256_sub_epi32(total, correction));
      }
    } else {
      for (int64_t t = 0; t < kTileN; ++t) raw[m][t] = _mm512_reduce_add_epi32(acc[m][t]) - kZeroPoint * sums[t];
    }
  }
#else
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t t = 0; t < kTileN; ++t) {
      int32_t acc = 0;
      for (int64_t k = 0; k < k_pad; ++k) {
        acc += static_cast<int32_t>(q[m][k]) * w[k / 64 * 64 * kTileN + t * 64 + k % 64];
      }
      raw[m][t] = acc - kZeroPoint * sums[t];
    }
  }
#endif
}

struct Int8Problem {
  const uint8_t (*q)[kMaxK];  // [M][kMaxK] quantized rows
  const float* row_max;       // [M]
  const int8_t* weight;       // [N, k_pad]
  const float* scales;        // [N]
  const int32_t* sums;        // [N]
  const float* bias;          // [N] or null
  float* out;                 // [M, N]
  int64_t n_dim, k_pad;
};

// fbgemm's dequantization order, (raw * (activation scale * weight scale)), then Int8Linear's * row max + bias,
// each product and sum rounded on its own as PyTorch rounds them (no fused multiply-add), so the results are equal.
template <int64_t kRows, int64_t kTileN>
__attribute__((optimize("fp-contract=off"))) void int8_store(const Int8Problem& p, int64_t n, int64_t count,
                                                              const int32_t (*raw)[kTileN]) {
  const float activation_scale = static_cast<float>(2.0 / 255.0);
  for (int64_t m = 0; m < kRows; ++m) {
    for (int64_t t = 0; t < count; ++t) {
      float res = static_cast<float>(raw[m][t]) * (activation_scale * p.scales[n + t]);
      res = res * p.row_max[m];
      if (p.bias != nullptr) res += p.bias[n + t];
      p.out[m * p.n_dim + n + t] = res;
    }
  }
}

template <int64_t kRows, int64_t kTileN>
void int8_range(const Int8Problem& p, int64_t n_begin, int64_t n_end) {
  int32_t raw[kRows][kTileN];
  int64_t n = n_begin;
  for (; n + kTileN <= n_end; n += kTileN) {
    int8_tile<kRows, kTileN>(p.q, p.weight + n * p.k_pad, p.k_pad, p.sums + n, raw);
    int8_store<kRows, kTileN>(p, n, kTileN, raw);
  }
  for (; n < n_end; ++n) {
    int32_t one[kRows][1];
    int8_tile<kRows, 1>(p.q, p.weight + n * p.k_pad, p.k_pad, p.sums + n, one);
    int8_store<kRows, 1>(p, n, 1, one);
  }
}

// The part of `p` that starts at input row m.
inline Int8Problem from_row(const Int8Problem& p, int64_t m) {
  Int8Problem rows = p;
  rows.q = p.q + m;
  rows.row_max = p.row_max + m;
  rows.out = p.out + m * p.n_dim;
  return rows;
}

// More rows than fit in registers beside a wide tile (a decode verifying drafts): for each tile of kTileN weight
// rows, the input rows in groups of kGroup. The tile comes from memory for the first group and from L1 for the
// others, and every group keeps the wide tile's cheap reductions (reduce8) instead of narrow tiles' scalar ones.
template <int64_t kGroup, int64_t kTileN>
void int8_range_grouped(const Int8Problem& p, int64_t m_dim, int64_t n_begin, int64_t n_end) {
  const int64_t n_tiled = n_begin + (n_end - n_begin) / kTileN * kTileN;
  for (int64_t n = n_begin; n < n_tiled; n += kTileN) {
    int64_t m = 0;
    for (; m + kGroup <= m_dim; m += kGroup) {
      const Int8Problem group = from_row(p, m);
      int32_t raw[kGroup][kTileN];
      int8_tile<kGroup, kTileN>(group.q, p.weight + n * p.k_pad, p.k_pad, p.sums + n, raw);
      int8_store<kGroup, kTileN>(group, n, kTileN, raw);
    }
    for (; m < m_dim; ++m) {
      const Int8Problem row = from_row(p, m);
      int32_t raw[1][kTileN];
      int8_tile<1, kTileN>(row.q, p.weight + n * p.k_pad, p.k_pad, p.sums + n, raw);
      int8_store<1, kTileN>(row, n, kTileN, raw);
    }
  }
  for (int64_t m = 0; m < m_dim && n_tiled < n_end; ++m) {  // the last few output channels, a row at a time
    const Int8Problem row = from_row(p, m);
    int8_range<1, 1>(row, n_tiled, n_end);
  }
}

}  // namespace

// weight [N, K_pad]: int8 rows zero-padded to K_pad, a multiple of 64 bytes (whole VNNI loads), K <= K_pad.
at::Tensor radixlm::small_batch_int8_linear(const at::Tensor& input, const at::Tensor& weight,
                                            const at::Tensor& weight_scales, const at::Tensor& weight_sums,
                                            const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(input.dim() >= 1, "x must have a feature dimension");
  TORCH_CHECK(weight.dim() == 2, "weight must be 2-D");
  const int64_t n_dim = weight.size(0), k_pad = weight.size(1), k_dim = input.size(-1);
  TORCH_CHECK(k_pad % 64 == 0 && k_dim <= k_pad && k_pad - k_dim < 64 && k_pad <= kMaxK,
              "int8 weight rows must be the input features (at most ", kMaxK,
              ") zero-padded to a multiple of 64");
  const int64_t m_dim = radixlm::check_rows(input, weight, k_dim, bias, at::kChar, kMaxInt8Rows);
  radixlm::check_dense_cpu(weight_scales, "weight_scales");
  radixlm::check_dense_cpu(weight_sums, "weight_sums");
  TORCH_CHECK(weight_scales.scalar_type() == at::kFloat && weight_scales.numel() == n_dim &&
                  weight_scales.is_contiguous(), "weight_scales must be contiguous float32 [N]");
  TORCH_CHECK(weight_sums.scalar_type() == at::kInt && weight_sums.numel() == n_dim && weight_sums.is_contiguous(),
              "weight_sums must be contiguous int32 [N]");
  const at::Tensor x = input.contiguous();  // no copy when it already is
  at::Tensor out = radixlm::empty_output(x, n_dim);
  if (m_dim == 0) return out;  // e.g. an LM head with no row to sample
  alignas(64) uint8_t q_stack[kStackRows][kMaxK];
  at::Tensor q_heap;  // 64-byte aligned, as every CPU tensor
  if (m_dim > kStackRows) q_heap = at::empty({m_dim, kMaxK}, x.options().dtype(at::kByte));
  uint8_t (*q)[kMaxK] = m_dim > kStackRows ? reinterpret_cast<uint8_t (*)[kMaxK]>(q_heap.data_ptr<uint8_t>()) : q_stack;
  float row_max[kMaxInt8Rows];
  for (int64_t m = 0; m < m_dim; ++m) row_max[m] = quantize_row(x.data_ptr<float>() + m * k_dim, k_dim, k_pad, q[m]);
  const Int8Problem p{q, row_max, weight.data_ptr<int8_t>(), weight_scales.data_ptr<float>(),
                      weight_sums.data_ptr<int32_t>(), bias.has_value() ? bias->data_ptr<float>() : nullptr,
                      out.data_ptr<float>(), n_dim, k_pad};
  const int64_t num_tiles = (n_dim + kInt8TileRows - 1) / kInt8TileRows;
  const int64_t grain_tiles = std::max<int64_t>(1, radixlm::grain_rows(k_pad) / kInt8TileRows);
  at::parallel_for(0, num_tiles, grain_tiles, [&](int64_t first, int64_t last) {
    const int64_t begin = first * kInt8TileRows, end = std::min(n_dim, last * kInt8TileRows);
    switch (m_dim) {
      case 1: int8_range<1, kInt8TileRows>(p, begin, end); break;
      case 2: int8_range<2, kInt8TileRows>(p, begin, end); break;
      default: int8_range_grouped<2, kInt8TileRows>(p, m_dim, begin, end); break;
    }
  });
  return out;
}
