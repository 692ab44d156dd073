// The GGUF linear's AMX path (gguf_amx.h): bfloat16 rows times a GGUF weight whose tiles are dequantized to bfloat16,
// a block of them at a time, straight into AMX's operand layout, then multiplied on the tiles.
//
// Why: the VNNI kernels (gguf_avx512.cpp) reach 450-490 GOP/s on two cores of a Xeon with AMX at 16-1,024 rows of
// a 1B Q4_K_M file, where the bfloat16 tiles run the same products at 1-1.4 TOP/s. Prefill chunks are many rows
// times each weight once, so unpacking the weight once a call costs little beside the products; a decode step reads
// each weight once for a few rows, and stays on the VNNI kernels (the Python side picks by row count).
//
// Layout. A GGUF tile holds 16 output features side by side, a 32-bit lane each, so a K-block of it (32 weights of
// each feature) becomes one B operand directly: 16 lines of 16 lanes, line j holding each feature's weights j and
// 16 + j as a bfloat16 pair (AMX multiplies pairs). The rows of x are copied once with the same pairing in every
// block of 32 (x[j], x[16 + j] side by side: `pair_rows`), so A is 16 rows of x as they lie in that copy, and each
// product tile is 16 rows of x by 16 features: the output's own orientation, stored without a transpose.
//
// Work. A unit is up to 16 tiles of one part. With more than 32 rows, a slice of K of its tiles (at most kUnitBytes
// of operands) is dequantized into the thread's scratch (it stays in L2), then every pass of 32 rows of x runs over it
// two tiles at a time (products 0-3: rows 0-15 and 16-31 by the two tiles; A 4, 5; B 6, 7), partial sums kept between
// slices. With 32 rows or fewer, each K-block is dequantized just before its products. Units go to the threads
// dynamically.
#include "gguf_amx.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "../amx_tiles.h"
#include "gguf_amx_operands.h"
#include "gguf_kernels.h"

namespace radixlm_gguf {
namespace {

constexpr int64_t kUnitBytes = int64_t{1} << 20;  // dequantized bytes of a unit's slice of K (in L2 beside x's pass)
constexpr int64_t kUnitTiles = 16;  // tiles of a unit (256 features), an even number: the passes take two at a time

// A unit: tiles [first, first + count) of one part.
struct Unit {
  const AmxPart* part;
  int64_t first, count;
};

// The product tiles' rows [0, rows) (c: 32 x 32 float32, rows of x by the two tiles' features), plus the bias,
// rounded to bfloat16 into out's rows from m, columns [column, column + cols) (cols <= 32).
RADIXLM_AMX void store_rows(const float* c, int64_t m, int64_t rows, const float* bias, uint16_t* out, int64_t N,
                            int64_t column, int64_t cols) {
  for (int64_t half = 0; half < 2 && cols > 16 * half; ++half) {
    const int64_t n = std::min<int64_t>(16, cols - 16 * half);
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
    const __m512 add = bias ? _mm512_maskz_loadu_ps(mask, bias + column + 16 * half) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 value = _mm512_add_ps(_mm512_loadu_ps(c + r * 32 + 16 * half), add);
      _mm256_mask_storeu_epi16(out + (m + r) * N + column + 16 * half, mask,
                               reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(value)));
    }
  }
}

// One K-block's products: A 4 (x's rows 0-15 of the pass) and, with kLower, 5 (rows 16-31), times B 6 (the first
// tile) and, with kTwo, 7 (the second), into products 0-3 (rows 0-15 / 16-31 by tile one / two: 0, 1 / 2, 3).
template <bool kLower, bool kTwo>
RADIXLM_AMX inline void block_products(const uint16_t* a, int64_t stride, const uint32_t* b_first,
                                       const uint32_t* b_second) {
  _tile_loadd(4, a, stride);
  if (kLower) _tile_loadd(5, a + 16 * stride / 2, stride);
  _tile_loadd(6, b_first, 64);
  _tile_dpbf16ps(0, 4, 6);
  if (kLower) _tile_dpbf16ps(2, 5, 6);
  if (kTwo) {
    _tile_loadd(7, b_second, 64);
    _tile_dpbf16ps(1, 4, 7);
    if (kLower) _tile_dpbf16ps(3, 5, 7);
  }
}

// Where a pass's products go: with `acc` null, straight to out (plus the bias) after all of K; else the pass covers
// a slice of K, its products start from acc's partial sums (unless `first`) and go back there (unless `last`, which
// writes out). acc holds the unit's rows by its features, `acc_ld` floats a row, the pass's two tiles from `acc_col`.
struct PassOutput {
  const float* bias;
  uint16_t* out;
  int64_t N, column, cols;
  float* acc;
  int64_t acc_ld, acc_col;
  bool first, last;
};

// Rows [m, m + rows) (rows <= 32) of x's paired copy times a tile pair (the second only with kTwo) over K-blocks
// [kb0, kb1). The B operands of a tile's K-block kb: `operand(tile, kb)` (0 the first, 1 the second).
template <bool kLower, bool kTwo, typename Operand>
RADIXLM_AMX void pass_tiles(const uint16_t* x_pairs, int64_t m, int64_t rows, int64_t K, int64_t kb0, int64_t kb1,
                            Operand operand, const PassOutput& o) {
  alignas(64) float c[32 * 32];
  float* partial = o.acc == nullptr ? nullptr : o.acc + m * o.acc_ld + o.acc_col;
  const int64_t partial_stride = o.acc_ld * 4;
  if (partial == nullptr || o.first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, partial, partial_stride);
    _tile_loadd(1, partial + 16, partial_stride);
    _tile_loadd(2, partial + 16 * o.acc_ld, partial_stride);
    _tile_loadd(3, partial + 16 * o.acc_ld + 16, partial_stride);
  }
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    block_products<kLower, kTwo>(x_pairs + m * K + kb * 32, K * 2, operand(0, kb), kTwo ? operand(1, kb) : nullptr);
  }
  if (partial != nullptr && !o.last) {
    _tile_stored(0, partial, partial_stride);
    _tile_stored(1, partial + 16, partial_stride);
    _tile_stored(2, partial + 16 * o.acc_ld, partial_stride);
    _tile_stored(3, partial + 16 * o.acc_ld + 16, partial_stride);
    return;
  }
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  if (kLower) {
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
  }
  store_rows(c, m, rows, o.bias, o.out, o.N, o.column, kTwo ? o.cols : std::min<int64_t>(16, o.cols));
}

template <typename Operand>
RADIXLM_AMX void pass(const uint16_t* x_pairs, int64_t m, int64_t rows, int64_t K, int64_t kb0, int64_t kb1, bool two,
                      Operand operand, const PassOutput& o) {
  if (rows > 16) {
    two ? pass_tiles<true, true>(x_pairs, m, rows, K, kb0, kb1, operand, o)
        : pass_tiles<true, false>(x_pairs, m, rows, K, kb0, kb1, operand, o);
  } else {
    two ? pass_tiles<false, true>(x_pairs, m, rows, K, kb0, kb1, operand, o)
        : pass_tiles<false, false>(x_pairs, m, rows, K, kb0, kb1, operand, o);
  }
}

// A unit with many rows: its tiles dequantized into `scratch` (in L2) a slice of K at a time (kUnitBytes of operands),
// then every pass of 32 rows over the slice. Every row of x is read once per slice of the unit, whose tiles (up to
// kUnitTiles) share the read; with K in slices, the partial sums wait in `acc` between them.
RADIXLM_AMX void run_unit(const Unit& unit, const uint16_t* x_pairs, int64_t M, int64_t K, const float* bias,
                          uint16_t* out, int64_t N, std::vector<uint32_t>& scratch, std::vector<float>& acc) {
  const AmxPart& part = *unit.part;
  const int64_t blocks = K / 32;
  const int64_t slice = std::clamp<int64_t>(kUnitBytes / (unit.count * kOperandWords * 4), 1, blocks);
  const int64_t acc_ld = (unit.count + 1) / 2 * 2 * kTileRows;  // a lone last tile's pair has columns here too
  if (slice < blocks) acc.resize((M + 31) / 32 * 32 * acc_ld);
  scratch.resize(unit.count * slice * kOperandWords);
  for (int64_t kb0 = 0; kb0 < blocks; kb0 += slice) {
    const int64_t kb1 = std::min(blocks, kb0 + slice), per_tile = (kb1 - kb0) * kOperandWords;
    for (int64_t t = 0; t < unit.count; ++t) {
      const uint8_t* tile = part.tiles + (unit.first + t) * part.tile_bytes;
      for (int64_t kb = kb0; kb < kb1; ++kb) {
        dequantize_block(part.type, tile, kb, scratch.data() + t * per_tile + (kb - kb0) * kOperandWords);
      }
    }
    for (int64_t m = 0; m < M; m += 32) {
      for (int64_t t = 0; t < unit.count; t += 2) {
        const int64_t local = (unit.first + t) * kTileRows;  // the tile's first feature within its part
        const uint32_t* first = scratch.data() + t * per_tile;
        const auto operand = [&](int which, int64_t kb) {
          return first + which * per_tile + (kb - kb0) * kOperandWords;
        };
        const PassOutput o{bias, out, N, part.first_column + local, part.out_features - local,
                           slice < blocks ? acc.data() : nullptr, acc_ld, t * kTileRows, kb0 == 0, kb1 == blocks};
        pass(x_pairs, m, std::min<int64_t>(32, M - m), K, kb0, kb1, t + 1 < unit.count, operand, o);
      }
    }
  }
}

// A unit with at most 32 rows (one pass): each K-block of a tile pair dequantized just before its products, into
// two operands that stay in L1 (a decode step reads each weight once; a round trip through L2 would cost more).
RADIXLM_AMX void stream_unit(const Unit& unit, const uint16_t* x_pairs, int64_t M, int64_t K, const float* bias,
                             uint16_t* out, int64_t N) {
  const AmxPart& part = *unit.part;
  alignas(64) uint32_t operands[2][2][kOperandWords];  // by K-block parity: a block's loads and the next's writes
  for (int64_t t = 0; t < unit.count; t += 2) {
    const uint8_t* tile = part.tiles + (unit.first + t) * part.tile_bytes;
    const bool two = t + 1 < unit.count;
    const auto operand = [&](int which, int64_t kb) {
      uint32_t* b = operands[kb & 1][which];
      dequantize_block(part.type, tile + which * part.tile_bytes, kb, b);
      return static_cast<const uint32_t*>(b);
    };
    const int64_t local = (unit.first + t) * kTileRows;
    const PassOutput o{bias, out, N, part.first_column + local, part.out_features - local, nullptr, 0, 0, true, true};
    pass(x_pairs, 0, M, K, 0, K / 32, two, operand, o);
  }
}

RADIXLM_AMX void pair_row_range(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, uint16_t* out) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t k = 0; k < K; k += 32) {
      _mm512_storeu_si512(out + r * K + k, pair_halves(_mm512_loadu_si512(x + r * K + k)));
    }
  }
}

// x's rows, paired within each K-block (see the header), padded with zero rows to a multiple of 32 (only those are
// cleared: a prefill's copy is tens of MB).
std::unique_ptr<uint16_t[]> pair_rows(const uint16_t* x, int64_t M, int64_t K) {
  const int64_t padded = (M + 31) / 32 * 32;
  std::unique_ptr<uint16_t[]> out(new uint16_t[padded * K]);
  std::fill(out.get() + M * K, out.get() + padded * K, uint16_t{0});
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) { pair_row_range(x, K, r0, r1, out.get()); });
  return out;
}

}  // namespace

void amx_linear(const uint16_t* x, int64_t M, int64_t K, const AmxPart* parts, int64_t num_parts, const float* bias,
                uint16_t* out, int64_t N) {
  const std::unique_ptr<uint16_t[]> x_pairs = pair_rows(x, M, K);
  std::vector<Unit> units;
  for (int64_t p = 0; p < num_parts; ++p) {
    const int64_t tiles = (parts[p].out_features + kTileRows - 1) / kTileRows;
    for (int64_t t = 0; t < tiles; t += kUnitTiles) units.push_back({&parts[p], t, std::min(kUnitTiles, tiles - t)});
  }
  const int64_t num_units = static_cast<int64_t>(units.size());
  const int num_threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), num_units));
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<uint32_t> scratch;
    std::vector<float> acc;
    radixlm::amx::configure_tiles();
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < num_units; ++u) {
      if (M <= 32) {
        stream_unit(units[u], x_pairs.get(), M, K, bias, out, N);
      } else {
        run_unit(units[u], x_pairs.get(), M, K, bias, out, N, scratch, acc);
      }
    }
    radixlm::amx::release_tiles();
  }
}

}  // namespace radixlm_gguf
