// Greedy tokens: each row's argmax in two passes over the row, its largest value (NaN skipped), then the first index
// holding it. PyTorch's `max(1).indices` over the same rows ran on one thread at about 6 GB/s (1.1 ms for 32 rows of
// 49,152 logits in a decode step of the default model on a Xeon); these rows are split over the threads.
#include "greedy_tokens.h"

#include <ATen/Parallel.h>

#include <cstdint>
#include <limits>

#include "../isa.h"
#include "../kernel_checks.h"

namespace radixlm {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The largest value of x[0, n), NaN skipped; -inf when there is none.
float row_max(const float* x, int64_t n) {
  float best = kNegInf;
  int64_t i = 0;
#if RADIXLM_BUILD_AVX512
  __m512 acc = _mm512_set1_ps(kNegInf);
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_loadu_ps(x + i), acc);  // a NaN lane keeps acc's value
  best = _mm512_reduce_max_ps(acc);
#endif
  for (; i < n; ++i) {
    if (x[i] > best) best = x[i];  // false for NaN
  }
  return best;
}

// The first index of x[0, n) equal to `value` (which one of them holds).
int64_t first_index(const float* x, int64_t n, float value) {
  int64_t i = 0;
#if RADIXLM_BUILD_AVX512
  const __m512 target = _mm512_set1_ps(value);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), target, _CMP_EQ_OQ);
    if (hit != 0) return i + __builtin_ctz(hit);
  }
#endif
  for (; i < n; ++i) {
    if (x[i] == value) return i;
  }
  return 0;
}

}  // namespace

at::Tensor greedy_tokens(const at::Tensor& logits) {
  check_dense_cpu(logits, "logits");
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.size(1) > 0,
              "greedy_tokens takes float32 logits [N, V] with V > 0, got ", logits.scalar_type(), " ",
              logits.sizes());
  TORCH_CHECK(logits.stride(1) == 1, "greedy_tokens: each row's values must be contiguous");
  const int64_t rows = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* base = logits.data_ptr<float>();
  int64_t* token_ids = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = base + r * stride;
      const float best = row_max(row, vocab);
      token_ids[r] = best == kNegInf ? 0 : first_index(row, vocab, best);
    }
  });
  return out;
}

}  // namespace radixlm
