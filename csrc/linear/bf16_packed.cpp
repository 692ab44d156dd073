// A bfloat16 linear on AVX-512 BF16 dot products (vdpbf16ps) over a weight packed once at load, for any number of
// rows: the decode step's few and a prefill chunk's hundreds.
//
// The packed weight is the plain [N, K] one regrouped by 32 output features: block b holds, for each pair of inputs
// (2p, 2p + 1), the 32 features' two weights as 32-bit words, so one 64-byte load gives 16 features' pairs and a dot
// product with one row's input pair broadcast adds both products to 16 outputs. No horizontal sums, and a block is
// one contiguous stream. Each thread takes whole blocks; per block, the inputs go by in chunks of kChunkK (the
// block's chunk, 16 KB, stays in L1 while every row of x passes over it) and rows in tiles of up to kTileRows, their
// float32 sums kept in a per-thread buffer between chunks. radixlm/model/bf16_linear.py packs the weight
// (`pack_weight`, in PyTorch) and holds the reference.
#include "bf16_packed.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../isa.h"
#include "../kernel_checks.h"
#include "../row_layout.h"

namespace {

constexpr int64_t kBlockN = 32;     // output features per packed block
constexpr int64_t kChunkK = 256;    // inputs per chunk (128 pairs: 16 KB of a block)
constexpr int kTileRows = 12;       // rows of x per register tile, at most (24 accumulators)
constexpr int64_t kPrefetchPairs = 16;  // how far ahead (2 KB) the first tile of a chunk prefetches the weight
// x's rows are read with their own stride, and copied kRowPadding elements apart when that stride is a multiple of
// kAliasBytes (csrc/row_layout.h: rows 4 KB apart share L1 sets, and a tile's 12 rows then evict each other).
using radixlm::kAliasBytes;
using radixlm::kRowPadding;

struct Problem {
  const uint16_t* x;  // rows ldx elements apart
  int64_t ldx;
  const uint32_t* w;  // [N / 32, K / 2, 32] words
  const float* bias;
  uint16_t* out;
  int64_t rows, n_dim, k_dim;
};

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// The tiles after a chunk's first stream the weights that come next toward L2 (`next`: pairs `phase`, `phase +
// phases`, ... of them; null: none): otherwise the first tile waits on memory and the others on nothing, and
// the two cores' reads of a decode step's weights do not overlap their arithmetic.
struct Ahead {
  const uint32_t* next;
  int64_t phase, phases;
};

// sums[m, 0..31] (+)= x[m0 + m, k0 .. k0 + 2 pairs) . block's weights, for kRows rows.
template <int kRows>
RADIXLM_AVX512_BF16 void tile(const Problem& p, const uint32_t* block, int64_t m0, int64_t k0, int64_t pairs,
                              float* sums, bool accumulate, bool prefetch, Ahead ahead) {
  __m512 acc[kRows][2];
  for (int m = 0; m < kRows; ++m) {
    acc[m][0] = accumulate ? _mm512_loadu_ps(sums + m * kBlockN) : _mm512_setzero_ps();
    acc[m][1] = accumulate ? _mm512_loadu_ps(sums + m * kBlockN + 16) : _mm512_setzero_ps();
  }
  const uint16_t* x = p.x + m0 * p.ldx + k0;
  const uint32_t* w = block + (k0 / 2) * kBlockN;
  for (int64_t i = 0; i < pairs; ++i) {
    const __m512bh w0 = as_bh(_mm512_loadu_si512(w + i * kBlockN));
    const __m512bh w1 = as_bh(_mm512_loadu_si512(w + i * kBlockN + 16));
    if (prefetch) {  // the first tile of a chunk reads it from memory: ask for the lines kPrefetchPairs ahead
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kPrefetchPairs) * kBlockN), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kPrefetchPairs) * kBlockN + 16), _MM_HINT_T0);
    } else if (ahead.next != nullptr && i % ahead.phases == ahead.phase) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead.next + i * kBlockN), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(ahead.next + i * kBlockN + 16), _MM_HINT_T1);
    }
    for (int m = 0; m < kRows; ++m) {
      uint32_t pair;
      std::memcpy(&pair, x + m * p.ldx + 2 * i, sizeof(pair));
      const __m512bh input = as_bh(_mm512_set1_epi32(static_cast<int>(pair)));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], input, w0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], input, w1);
    }
  }
  for (int m = 0; m < kRows; ++m) {
    _mm512_storeu_ps(sums + m * kBlockN, acc[m][0]);
    _mm512_storeu_ps(sums + m * kBlockN + 16, acc[m][1]);
  }
}

// Rows m0 .. m0 + count (count 1 .. kTileRows) as one register tile.
RADIXLM_AVX512_BF16 void row_tile(const Problem& p, const uint32_t* block, int64_t m0, int64_t count, int64_t k0,
                                  int64_t pairs, float* sums, bool accumulate, Ahead ahead) {
  float* s = sums + m0 * kBlockN;
  const bool prefetch = m0 == 0;
  switch (count) {
    case 12: tile<12>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 11: tile<11>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 10: tile<10>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 9: tile<9>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 8: tile<8>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 7: tile<7>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 6: tile<6>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 5: tile<5>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 4: tile<4>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 3: tile<3>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    case 2: tile<2>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
    default: tile<1>(p, block, m0, k0, pairs, s, accumulate, prefetch, ahead); break;
  }
}

// Output features b * 32 .. of every row; `last` is the thread's last block (what comes after it is not its own).
RADIXLM_AVX512_BF16 void block_columns(const Problem& p, int64_t b, int64_t last, std::vector<float>& sums) {
  const uint32_t* block = p.w + b * (p.k_dim / 2) * kBlockN;
  for (int64_t k0 = 0; k0 < p.k_dim; k0 += kChunkK) {
    const int64_t pairs = std::min(kChunkK, p.k_dim - k0) / 2;
    // The next chunk's weights: this block's, else the next block's first (they follow in memory).
    const bool more = k0 + kChunkK < p.k_dim || b < last;
    const uint32_t* next = more ? block + (k0 + kChunkK) / 2 * kBlockN : nullptr;
    // Rows in tiles of nearly equal size (16 rows: 8 + 8, not 12 + 4), each as many accumulators as it can.
    const int64_t num_tiles = (p.rows + kTileRows - 1) / kTileRows;
    for (int64_t t = 0, m0 = 0; t < num_tiles; ++t) {
      const int64_t count = p.rows / num_tiles + (t < p.rows % num_tiles ? 1 : 0);
      const Ahead ahead{t > 0 ? next : nullptr, std::max<int64_t>(0, t - 1), std::max<int64_t>(1, num_tiles - 1)};
      row_tile(p, block, m0, count, k0, pairs, sums.data(), k0 > 0, ahead);
      m0 += count;
    }
  }
  const int64_t n0 = b * kBlockN, width = std::min(kBlockN, p.n_dim - n0);
  const __mmask32 keep = width == kBlockN ? ~__mmask32{0} : (__mmask32{1} << width) - 1;
  __m512 bias[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  if (p.bias != nullptr) {
    for (int half = 0; half < 2; ++half) {
      const int64_t j0 = 16 * half, count = std::clamp<int64_t>(width - j0, 0, 16);
      bias[half] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p.bias + n0 + j0);
    }
  }
  for (int64_t m = 0; m < p.rows; ++m) {
    const float* row = sums.data() + m * kBlockN;
    const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(row), bias[0]);
    const __m512 hi = _mm512_add_ps(_mm512_loadu_ps(row + 16), bias[1]);
    const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // rounded to nearest even
    _mm512_mask_storeu_epi16(p.out + m * p.n_dim + n0, keep, packed);
  }
}

}  // namespace

namespace radixlm {

at::Tensor bf16_packed_linear(const at::Tensor& input, const at::Tensor& packed, int64_t out_features,
                              const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(isa::cpu_has_avx512_bf16(), "bf16_packed_linear needs a CPU with AVX-512 BF16");
  check_dense_cpu(input, "x");
  check_dense_cpu(packed, "packed");
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && input.dim() >= 1, "x must be bfloat16 [..., K]");
  const int64_t k_dim = input.size(-1), num_blocks = (out_features + kBlockN - 1) / kBlockN;
  TORCH_CHECK(out_features > 0 && k_dim > 0 && k_dim % 2 == 0, "out_features must be positive and K even");
  TORCH_CHECK(packed.scalar_type() == at::kInt && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) == num_blocks && packed.size(1) == k_dim / 2 && packed.size(2) == kBlockN,
              "packed must be contiguous int32 [ceil(N / 32), K / 2, 32] for x's K and out_features");
  at::Tensor float_bias;
  if (bias.has_value()) {
    check_dense_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out_features, "bias must be [N]");
    float_bias = bias->to(at::kFloat).contiguous();
  }
  // A view with evenly spaced rows (silu_and_mul's padded output) is read as it is.
  int64_t ldx = uniform_row_stride(input);
  at::Tensor x = ldx > 0 ? input : input.contiguous();
  if (ldx == 0) ldx = k_dim;
  at::Tensor out = empty_output(x, out_features);
  const int64_t rows = x.numel() / k_dim;
  if (rows == 0) return out;
  if (rows > 1 && (ldx * 2) % kAliasBytes == 0) {
    ldx = k_dim + kRowPadding;
    x = at::constant_pad_nd(x.reshape({rows, k_dim}), {0, kRowPadding});
  }
  const Problem p{reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), ldx,
                  reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>()),
                  float_bias.defined() ? float_bias.data_ptr<float>() : nullptr,
                  reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), rows, out_features, k_dim};
  // At least kGrainBytes of weight, or the equivalent arithmetic, per task.
  const int64_t grain = std::max<int64_t>(1, grain_rows(k_dim * 2) / kBlockN / std::max<int64_t>(1, rows / 4));
  at::parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(rows * kBlockN);
    for (int64_t b = begin; b < end; ++b) block_columns(p, b, end - 1, sums);
  });
  return out;
}

}  // namespace radixlm
