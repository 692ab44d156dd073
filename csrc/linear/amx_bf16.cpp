// A bfloat16 linear on AMX-BF16 tiles for the few rows of a decode step, on the plain nn.Linear weight.
//
// Why our own: a decode step multiplies a few rows by every weight once, so it is a read of the weights. oneDNN's
// linear (`F.linear`, or `mkldnn._linear_pointwise` on its prepacked layout) read the default model's weights at
// 13-16 GB/s on a Xeon with AMX (2 threads, 1-32 rows) where a plain reduction over the same tensors reads 36 GB/s;
// this loop, each thread walking its share of the weight front to back, took 1.25-1.3x less time than the prepacked
// path and 1.7-1.9x less than `F.linear` over the default model's fused linears. From 128-320 rows on oneDNN's
// matmul is faster, and radixlm/model/bf16_linear.py hands those calls to `F.linear`.
//
// The weight stays [N, K] (no second copy, and an LM head tied to the embedding needs nothing more): it is the A
// operand, the rows of x the B operand, so each tile product computes a block of the output transposed. A group of
// 32 output features is 32 contiguous weight rows; per K step of 32 inputs the two A tiles are its 32 rows' next 64
// bytes, and the B tiles hold x's rows (up to 32 per pass) in AMX's pair-interleaved layout, built once per call
// (`interleave_rows`). The 32 x 32 float32 block is then written transposed, rounded to bfloat16, bias added.
#include "amx_bf16.h"

#include <ATen/Parallel.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../amx_tiles.h"
#include "../exp_nonpositive.h"
#include "../isa.h"
#include "../kernel_checks.h"
#include "../transpose16.h"

namespace {

constexpr int64_t kGroup = 32;  // output features per group (two 16-row A tiles), and rows of x per pass
constexpr int64_t kStep = 32;   // input features per K step (64 bytes of a row)

// Linux's arch_prctl request for a tile-data permission, and the XSAVE feature number of tile data.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = (edx >> 24) & 1, bf16 = (edx >> 22) & 1;
  return tile && bf16 && __builtin_cpu_supports("avx512bf16") && radixlm::isa::cpu_has_avx512();
}

// The tiles (amx_tiles.h). C: 0 (features 0-15 x rows 0-15), 1 (features 0-15 x rows 16-31), 2 (16-31 x 0-15),
// 3 (16-31 x 16-31); A: 4, 5 (the weight's rows 0-15, 16-31); B: 6, 7 (x's rows 0-15, 16-31).
using radixlm::amx::configure_tiles;
using radixlm::amx::release_tiles;

using radixlm::transpose16;  // transpose16.h

// One group's 32 x 32 block (features x rows) of x's rows [32 * pass, +32), into c (stride 32 floats). kBoth:
// rows 16-31 exist. `x_pairs` is the pass's interleaved rows: K / 2 lines of 32 pairs.
template <bool kBoth>
RADIXLM_AMX void block(const at::BFloat16* w, int64_t K, const at::BFloat16* x_pairs, float* c) {
  _tile_zero(0);
  _tile_zero(2);
  if (kBoth) {
    _tile_zero(1);
    _tile_zero(3);
  }
  const int64_t stride = K * 2;
  for (int64_t k = 0; k < K; k += kStep) {
    const at::BFloat16* b = x_pairs + k * kGroup;  // 16 lines of 32 pairs
    _tile_loadd(4, w + k, stride);
    _tile_loadd(6, b, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, w + 16 * K + k, stride);
    _tile_dpbf16ps(2, 5, 6);
    if (kBoth) {
      _tile_loadd(7, b + 32, 128);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 128);
  _tile_stored(2, c + 16 * kGroup, 128);
  if (kBoth) {
    _tile_stored(1, c + 16, 128);
    _tile_stored(3, c + 16 * kGroup + 16, 128);
  }
}

// 16 bfloat16 values as float32.
RADIXLM_AMX inline __m512 widen16(const at::BFloat16* values) {
  const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}

// Rows [r0, r0 + 16) of a group's 32 x 32 block c (features x rows), row by row: low[j] holds features 0-15 of row
// r0 + j, high[j] features 16-31 (two 16 x 16 transposes).
RADIXLM_AMX inline void block_rows(const float* c, int64_t r0, __m512i (&low)[16], __m512i (&high)[16]) {
  for (int i = 0; i < 16; ++i) {
    low[i] = _mm512_loadu_si512(c + i * kGroup + r0);
    high[i] = _mm512_loadu_si512(c + (16 + i) * kGroup + r0);
  }
  transpose16(low);
  transpose16(high);
}

// The block's rows [0, rows) of x: c[f][r] for the 32 features f, plus the bias (and residual[r * N + f] when
// residual is not null), rounded to bfloat16 once into out[r * N + f].
RADIXLM_AMX void store_block(const float* c, const float* bias, const at::BFloat16* residual, at::BFloat16* out,
                             int64_t rows, int64_t N) {
  const __m512 bias_low = _mm512_loadu_ps(bias), bias_high = _mm512_loadu_ps(bias + 16);
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    __m512i low[16], high[16];
    block_rows(c, r0, low, high);
    for (int64_t j = 0; j < std::min<int64_t>(16, rows - r0); ++j) {
      __m512 a = _mm512_add_ps(_mm512_castsi512_ps(low[j]), bias_low);
      __m512 b = _mm512_add_ps(_mm512_castsi512_ps(high[j]), bias_high);
      if (residual != nullptr) {
        a = _mm512_add_ps(a, widen16(residual + (r0 + j) * N));
        b = _mm512_add_ps(b, widen16(residual + (r0 + j) * N + 16));
      }
      _mm512_storeu_si512(out + (r0 + j) * N, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
}

// silu(gate) * up, lane by lane, in float32 (silu_and_mul.cpp's formula: no exp of a positive number).
RADIXLM_AMX inline __m512 silu_times(__m512 gate, __m512 up) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 e = radixlm::exp16_nonpositive(_mm512_or_ps(gate, _mm512_set1_ps(-0.f)));  // exp(-|gate|)
  const __mmask16 nonnegative = _mm512_cmp_ps_mask(gate, _mm512_setzero_ps(), _CMP_GE_OQ);  // false for NaN
  const __m512 sigmoid = _mm512_div_ps(_mm512_mask_blend_ps(nonnegative, e, one), _mm512_add_ps(one, e));
  return _mm512_mul_ps(_mm512_mul_ps(gate, sigmoid), up);
}

// A gated group's block (features 0-15 the gate, 16-31 the up projection of the same 16 outputs): rows [0, rows)
// of silu(gate) * up, rounded to bfloat16 once, into out[r * stride + f] for its 16 outputs f.
RADIXLM_AMX void store_gated_block(const float* c, at::BFloat16* out, int64_t rows, int64_t stride) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    __m512i gate[16], up[16];
    block_rows(c, r0, gate, up);
    for (int64_t j = 0; j < std::min<int64_t>(16, rows - r0); ++j) {
      const __m512 value = silu_times(_mm512_castsi512_ps(gate[j]), _mm512_castsi512_ps(up[j]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (r0 + j) * stride), (__m256i)_mm512_cvtneps_pbh(value));
    }
  }
}

// Where the groups' blocks go: out[M, stride], each group's 32 features plus the bias (and the residual), or, gated,
// its 16 outputs of silu(gate) * up.
struct Epilogue {
  const float* bias;             // [N], unless gated
  const at::BFloat16* residual;  // [M, N] or null
  at::BFloat16* out;
  int64_t stride;  // N, or N / 2 when gated
  bool gated;
};

// Groups [g0, g1) of the output, every row of x.
RADIXLM_AMX void run_groups(const at::BFloat16* w, const at::BFloat16* x_pairs, const Epilogue& e, int64_t M,
                            int64_t K, int64_t g0, int64_t g1) {
  alignas(64) float c[kGroup * kGroup];
  configure_tiles();
  for (int64_t g = g0; g < g1; ++g) {
    const at::BFloat16* group = w + g * kGroup * K;
    for (int64_t m = 0; m < M; m += kGroup) {
      const int64_t rows = std::min<int64_t>(kGroup, M - m);
      const at::BFloat16* pass = x_pairs + m * K;
      rows > 16 ? block<true>(group, K, pass, c) : block<false>(group, K, pass, c);
      if (e.gated) {
        store_gated_block(c, e.out + m * e.stride + g * 16, rows, e.stride);
        continue;
      }
      const at::BFloat16* residual = e.residual == nullptr ? nullptr : e.residual + m * e.stride + g * kGroup;
      store_block(c, e.bias + g * kGroup, residual, e.out + m * e.stride + g * kGroup, rows, e.stride);
    }
  }
  release_tiles();
}

// x's rows in passes of 32 (the last padded with zeros), each as K / 2 lines of 32 pairs: pair p of row r at
// line p, position r. A pair of bfloat16 is one 32-bit word, so this transposes 16 x 16 blocks of words.
RADIXLM_AMX std::vector<uint32_t> interleave_rows(const at::BFloat16* x, int64_t M, int64_t K) {
  const int64_t passes = (M + kGroup - 1) / kGroup, pairs = K / 2;
  std::vector<uint32_t> out(passes * pairs * kGroup);
  const auto* words = reinterpret_cast<const uint32_t*>(x);
  for (int64_t r0 = 0; r0 < passes * kGroup; r0 += 16) {
    uint32_t* lines = out.data() + (r0 / kGroup) * pairs * kGroup + r0 % kGroup;
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      __m512i block[16];
      for (int64_t i = 0; i < 16; ++i) {
        block[i] = r0 + i < M ? _mm512_loadu_si512(words + (r0 + i) * pairs + p0) : _mm512_setzero_si512();
      }
      transpose16(block);
      for (int64_t j = 0; j < 16; ++j) _mm512_storeu_si512(lines + (p0 + j) * kGroup, block[j]);
    }
  }
  return out;
}

}  // namespace

namespace radixlm {

bool amx_bf16_available() {
  static const bool available =
      cpu_has_amx_bf16() && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return available;
}

namespace {

// Checks x and the weight (see amx_bf16.h); returns x as contiguous [M, K] rows.
at::Tensor checked_rows(const at::Tensor& input, const at::Tensor& weight, const char* name) {
  check_dense_cpu(input, "x");
  check_dense_cpu(weight, "weight");
  TORCH_CHECK(amx_bf16_available(), name, " needs a CPU with AMX-BF16 (and the OS's permission)");
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16, name,
              " takes bfloat16 x and weight");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous(), "the weight must be contiguous [N, K]");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(N > 0 && K > 0 && N % kGroup == 0 && K % kStep == 0,
              "the weight's sizes must be positive multiples of 32, got [", N, ", ", K, "]");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) == K, "x has ", input.size(-1), " features, the weight ", K);
  return input.reshape({-1, K}).contiguous();
}

// The most rows of K inputs a call takes at once: every group reads x's rows again, which stays cheap while they stay
// in L2 (about 1 MiB of them, 320 rows at most, 64 at least). More rows go in even chunks, each through every group.
// The gated MLP projection runs here at any row count (its silu in the writes spares a pass over the [rows, 2I]
// projection): against `F.linear` and `silu_and_mul` over the same rows, 256-row chunks took 0.94-0.97x the time at
// 512 and 2,048 rows of the default model's gate/up weight (K 576) and 0.72-0.96x on the 1B shape's (K 2,048); on the
// 8B shape's (K 4,096) 256-row chunks took 1.03-1.10x, 128-row ones 0.92-0.99x (cold weights, medians; a Xeon with
// AMX, 2 threads). In one engine, 320-row chunks took the default model's 512- and 2,048-token prefills 1.02x faster.
int64_t chunk_rows(int64_t K) {
  return std::clamp<int64_t>((int64_t{1} << 20) / (2 * K) / kGroup * kGroup, 64, 320);
}

// Runs every group of the weight over x's rows into e (whose out is [M, e.stride]).
void run(const at::Tensor& x, const at::Tensor& weight, const Epilogue& e) {
  const int64_t M = x.size(0), N = weight.size(0), K = weight.size(1);
  if (M == 0) return;
  const int64_t most = chunk_rows(K), num_chunks = (M + most - 1) / most;
  const at::BFloat16* w = weight.data_ptr<at::BFloat16>();
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    const int64_t m0 = M * chunk / num_chunks, rows = M * (chunk + 1) / num_chunks - m0;
    const std::vector<uint32_t> x_pairs = interleave_rows(x.data_ptr<at::BFloat16>() + m0 * K, rows, K);
    const auto* pairs = reinterpret_cast<const at::BFloat16*>(x_pairs.data());
    const Epilogue rows_e{e.bias, e.residual == nullptr ? nullptr : e.residual + m0 * e.stride,
                          e.out + m0 * e.stride, e.stride, e.gated};
    at::parallel_for(0, N / kGroup, 1, [&](int64_t g0, int64_t g1) { run_groups(w, pairs, rows_e, rows, K, g0, g1); });
  }
}

std::vector<int64_t> out_shape(const at::Tensor& input, int64_t features) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape.back() = features;
  return shape;
}

}  // namespace

at::Tensor amx_bf16_linear(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                           const c10::optional<at::Tensor>& residual) {
  const at::Tensor x = checked_rows(input, weight, "amx_bf16_linear");
  const int64_t N = weight.size(0);
  std::vector<float> bias_values(N, 0.0f);
  if (bias.has_value()) {
    check_dense_cpu(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "bias must be [", N, "]");
    const at::Tensor values = bias->to(at::kFloat).contiguous();
    std::copy(values.data_ptr<float>(), values.data_ptr<float>() + N, bias_values.begin());
  }
  const std::vector<int64_t> shape = out_shape(input, N);
  at::Tensor residual_rows;
  if (residual.has_value()) {
    check_dense_cpu(*residual, "residual");
    TORCH_CHECK(residual->scalar_type() == at::kBFloat16 && residual->sizes() == at::IntArrayRef(shape),
                "residual must be bfloat16 of the output's shape ", at::IntArrayRef(shape), ", got ",
                residual->scalar_type(), " ", residual->sizes());
    residual_rows = residual->reshape({-1, N}).contiguous();
  }
  at::Tensor out = at::empty(shape, input.options());
  const at::BFloat16* r = residual_rows.defined() ? residual_rows.data_ptr<at::BFloat16>() : nullptr;
  run(x, weight, {bias_values.data(), r, out.data_ptr<at::BFloat16>(), N, false});
  return out;
}

at::Tensor amx_bf16_gated_linear(const at::Tensor& input, const at::Tensor& weight) {
  const at::Tensor x = checked_rows(input, weight, "amx_bf16_gated_linear");
  const int64_t outputs = weight.size(0) / 2;
  at::Tensor out = at::empty(out_shape(input, outputs), input.options());
  run(x, weight, {nullptr, nullptr, out.data_ptr<at::BFloat16>(), outputs, true});
  return out;
}

}  // namespace radixlm
