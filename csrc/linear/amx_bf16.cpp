// A bfloat16 linear on AMX-BF16 tiles, for the rows of a decode step (and any other count).
//
// Why our own: a decode step multiplies a few rows by every weight once, so it is a read of the weights. oneDNN's
// linear on its own prepacked layout (`mkldnn._linear_pointwise`) read the default model's weights at 13-16 GB/s on a
// Xeon with AMX (2 threads, 1-32 rows), against 36 GB/s for a plain reduction over the same tensors; this loop,
// which walks each thread's share of the weight front to back with software prefetch, read them 1.5-2x faster
// (tests/unit/test_amx_linear.py holds it to the PyTorch reference; `radixlm bench step` shows the step).
//
// Layout: W packed [N / 32, K / 2, 32, 2]: for each group of 32 output features, K / 2 rows of 32 pairs of consecutive
// input features, so a 16 x 16 B tile of one K step (32 inputs) is 16 rows of 64 bytes at a stride of 128, and one
// K step of a group is 2 KB of contiguous memory. Each thread takes whole groups; for each group and each 32 rows of x
// it accumulates a 32 x 32 float32 block in four C tiles (2 A tiles of x, 2 B tiles of W per K step), then rounds it
// to bfloat16 (plus the bias) into the output.
#include "amx_bf16.h"

#include <ATen/Parallel.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cpuid.h>
#include <cstdint>
#include <vector>

#include "../isa.h"
#include "../kernel_checks.h"

#define RADIXLM_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

constexpr int64_t kGroup = 32;        // output features per group (two 16-column B tiles)
constexpr int64_t kStep = 32;         // input features per K step (one A tile's 64 bytes of a row)
constexpr int64_t kStepBytes = 2048;  // one K step of one group: 16 rows x 128 bytes
// How far ahead (in K steps) a thread prefetches its weights when it reads them once (up to 32 rows of x):
// 8 steps = 16 KB, the best of 0, 2, 4, 8 and 16 on the default model's shapes (1-32 rows).
constexpr int64_t kPrefetchSteps = 8;

// Linux's arch_prctl request for a tile-data permission, and the XSAVE feature number of tile data.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = (edx >> 24) & 1, bf16 = (edx >> 22) & 1;
  return tile && bf16 && __builtin_cpu_supports("avx512bf16") && radixlm::isa::cpu_has_avx512();
}

// Tiles 0-3: C (rows 0-15 x columns 0-15, 0-15 x 16-31, 16-31 x 0-15, 16-31 x 16-31); 4, 5: A (rows 0-15, 16-31);
// 6, 7: B (columns 0-15, 16-31). `rows_high` 0: one row tile only (its tiles get 1 row, unused).
RADIXLM_AMX void configure_tiles(int rows_low, int rows_high) {
  TileConfig config{};
  config.palette_id = 1;
  const int high = rows_high > 0 ? rows_high : 1;
  const uint8_t rows[8] = {static_cast<uint8_t>(rows_low), static_cast<uint8_t>(rows_low), static_cast<uint8_t>(high),
                           static_cast<uint8_t>(high),     static_cast<uint8_t>(rows_low), static_cast<uint8_t>(high),
                           16,                             16};
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = rows[t];
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

// One 32 x 32 block (or 16 x 32 when kHigh is false): x rows from `x` (stride K), one group's packed weight `w`.
template <bool kHigh, bool kPrefetch>
RADIXLM_AMX void block(const at::BFloat16* x, int64_t K, const at::BFloat16* w, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  if (kHigh) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t stride = K * 2;
  for (int64_t k = 0; k < K; k += kStep) {
    const char* b = reinterpret_cast<const char*>(w) + (k / kStep) * kStepBytes;
    if (kPrefetch) {
      for (int64_t line = 0; line < kStepBytes; line += 64) {
        _mm_prefetch(b + kPrefetchSteps * kStepBytes + line, _MM_HINT_T0);
      }
    }
    _tile_loadd(6, b, 128);
    _tile_loadd(7, b + 64, 128);
    _tile_loadd(4, x + k, stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (kHigh) {
      _tile_loadd(5, x + 16 * K + k, stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  if (kHigh) {
    _tile_stored(2, c + 16 * kGroup, 128);
    _tile_stored(3, c + 16 * kGroup + 16, 128);
  }
}

// The block's `rows` rows (float32, stride 32) plus `bias` (32 floats), rounded to bfloat16 into out (stride N).
RADIXLM_AMX void store_block(const float* c, const float* bias, at::BFloat16* out, int64_t rows, int64_t N) {
  const __m512 bias_low = _mm512_loadu_ps(bias), bias_high = _mm512_loadu_ps(bias + 16);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 low = _mm512_add_ps(_mm512_loadu_ps(c + r * kGroup), bias_low);
    const __m512 high = _mm512_add_ps(_mm512_loadu_ps(c + r * kGroup + 16), bias_high);
    _mm512_storeu_si512(out + r * N, (__m512i)_mm512_cvtne2ps_pbh(high, low));
  }
}

// Groups [g0, g1) of the output, every row of x.
RADIXLM_AMX void run_groups(const at::BFloat16* x, const at::BFloat16* w, const float* bias, at::BFloat16* out,
                            int64_t M, int64_t N, int64_t K, int64_t g0, int64_t g1) {
  alignas(64) float c[kGroup * kGroup];
  int configured_low = -1, configured_high = -1;
  const bool prefetch = M <= kGroup;  // more rows re-read each group from cache: nothing to bring in ahead
  for (int64_t g = g0; g < g1; ++g) {
    const at::BFloat16* group = w + g * kGroup * K;
    for (int64_t m = 0; m < M; m += kGroup) {
      const int64_t rows = std::min<int64_t>(kGroup, M - m);
      const int low = static_cast<int>(std::min<int64_t>(rows, 16)), high = static_cast<int>(rows) - low;
      if (low != configured_low || high != configured_high) {
        configure_tiles(low, high);
        configured_low = low;
        configured_high = high;
      }
      const at::BFloat16* rows_x = x + m * K;
      if (high > 0) {
        prefetch ? block<true, true>(rows_x, K, group, c) : block<true, false>(rows_x, K, group, c);
      } else {
        prefetch ? block<false, true>(rows_x, K, group, c) : block<false, false>(rows_x, K, group, c);
      }
      store_block(c, bias + g * kGroup, out + m * N + g * kGroup, rows, N);
    }
  }
  _tile_release();
}

}  // namespace

namespace radixlm {

bool amx_bf16_available() {
  static const bool available =
      cpu_has_amx_bf16() && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return available;
}

at::Tensor amx_bf16_linear(const at::Tensor& input, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  check_dense_cpu(input, "x");
  check_dense_cpu(packed, "packed");
  TORCH_CHECK(amx_bf16_available(), "amx_bf16_linear needs a CPU with AMX-BF16 (and the OS's permission)");
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "amx_bf16_linear takes bfloat16 x and weight");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kGroup && packed.size(3) == 2 && packed.is_contiguous(),
              "the packed weight must be contiguous [N / 32, K / 2, 32, 2]");
  const int64_t N = packed.size(0) * kGroup, K = packed.size(1) * 2;
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) == K, "x has ", input.size(-1), " features, the weight ", K);
  TORCH_CHECK(K % kStep == 0 && K > 0, "the weight's input features must be a positive multiple of 32, got ", K);
  std::vector<float> bias_values(N, 0.0f);
  if (bias.has_value()) {
    check_dense_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "bias must be [", N, "]");
    const at::Tensor values = bias->to(at::kFloat).contiguous();
    std::copy(values.data_ptr<float>(), values.data_ptr<float>() + N, bias_values.begin());
  }
  const at::Tensor x = input.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<int64_t> out_shape(input.sizes().begin(), input.sizes().end());
  out_shape.back() = N;
  at::Tensor out = at::empty(out_shape, input.options());
  if (M == 0) return out;
  const at::BFloat16* xp = x.data_ptr<at::BFloat16>();
  const at::BFloat16* wp = packed.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, N / kGroup, 1, [&](int64_t g0, int64_t g1) {
    run_groups(xp, wp, bias_values.data(), op, M, N, K, g0, g1);
  });
  return out;
}

}  // namespace radixlm
