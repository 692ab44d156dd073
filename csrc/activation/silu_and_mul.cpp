// silu(gate) * up of a gated MLP (radixlm.model.fused_ops.FusedGatedMLP) for bfloat16 rows, in one pass.
//
// PyTorch runs it as two slices, a bfloat16 silu and a product, each a pass over memory with its own rounding; the
// silu alone took 420 us for 1,000 rows of 1,536 on this CPU (60 calls in a 1,000-token prefill of the default
// model, 25 ms in all). Here each element is x * sigmoid(x) times up in float32, rounded to bfloat16 once, so it
// differs from PyTorch's by at most a bfloat16 step. sigmoid takes e = exp(-|x|) (exp_nonpositive.h, the decode
// kernel's exp): 1 / (1 + e) for x >= 0, e / (1 + e) below, so no exp can overflow.

#include "silu_and_mul.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bf16_vec.h"
#include "exp_nonpositive.h"
#include "kernel_checks.h"
#include "row_layout.h"

namespace {

constexpr int64_t kGrainElements = 1 << 15;  // output elements per parallel task: a decode's rows stay on one thread

using radixlm_bf16::v16f;

// exp(-|x|) lane by lane.
inline v16f exp_minus_abs(v16f x) {
  const v16f minus_abs = x < 0 ? x : -x;  // a NaN stays a NaN
#if RADIXLM_BUILD_AVX512
  return reinterpret_cast<v16f>(radixlm::exp16_nonpositive(reinterpret_cast<__m512>(minus_abs)));
#elif defined(__AVX2__)
  __m256 halves[2];
  std::memcpy(halves, &minus_abs, sizeof(halves));
  halves[0] = radixlm::exp8_nonpositive(halves[0]);
  halves[1] = radixlm::exp8_nonpositive(halves[1]);
  v16f e;
  std::memcpy(&e, halves, sizeof(e));
  return e;
#else
  v16f e;
  for (int i = 0; i < 16; ++i) e[i] = radixlm::exp_nonpositive(minus_abs[i]);
  return e;
#endif
}

void silu_and_mul_row(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  using namespace radixlm_bf16;
  const int64_t n_vec = n / 16 * 16;
  for (int64_t i = 0; i < n_vec; i += 16) {
    const v16f x = load16(gate + i);
    const v16f e = exp_minus_abs(x);
    const v16f sigmoid = (x >= 0 ? v16f{} + 1.f : e) / (1.f + e);
    store16(out + i, x * sigmoid * load16(up + i));
  }
  for (int64_t i = n_vec; i < n; ++i) {
    const float x = to_float(gate[i]);
    const float e = radixlm::exp_nonpositive(x < 0 ? x : -x);
    out[i] = to_bf16(x * ((x >= 0 ? 1.f : e) / (1.f + e)) * to_float(up[i]));
  }
}

// A row whose gate and up halves alternate in blocks of 16 (gate 0-15, up 0-15, gate 16-31, ...): the layout
// `amx_bf16_gated_linear`'s interleaved weight gives `F.linear` above that kernel's rows.
void silu_and_mul_blocks_row(const uint16_t* gate_up, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 16) silu_and_mul_row(gate_up + 2 * i, gate_up + 2 * i + 16, 16, out + i);
}

}  // namespace

at::Tensor radixlm::silu_and_mul(const at::Tensor& gate_up, bool pad_rows, bool blocks16) {
  radixlm::check_dense_cpu(gate_up, "gate_up");
  TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16, "gate_up must be bfloat16, got ", gate_up.scalar_type());
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "gate_up must be [..., 2I], got ", gate_up.sizes());
  const at::Tensor x = gate_up.contiguous();  // no copy when it already is
  const int64_t n = x.size(-1) / 2;
  const int64_t rows = n > 0 ? x.numel() / (2 * n) : 0;
  TORCH_CHECK(!blocks16 || n % 16 == 0, "gate_up in blocks of 16 must be [..., 32 k], got ", gate_up.sizes());
  // With pad_rows, rows the next linear would copy apart (csrc/row_layout.h) are written apart: a view of a wider
  // tensor, which bf16_packed_linear reads as it is.
  int64_t stride = n;
  const at::Tensor out = radixlm::empty_rows(x, n, pad_rows, &stride);
  if (out.numel() == 0) return out;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (blocks16) {
        silu_and_mul_blocks_row(xp + r * 2 * n, n, op + r * stride);
      } else {
        silu_and_mul_row(xp + r * 2 * n, xp + r * 2 * n + n, n, op + r * stride);
      }
    }
  });
  return out;
}
