// The row maximum that Int8Linear's per-token scaling divides by, shared by the int8 kernel (linear_int8.cpp) and the
// scaling around fbgemm (int8_scaling.cpp), so that a row gets the same maximum, NaN included, at any batch size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "isa.h"

namespace radixlm_int8 {

// max |x[i]| over the row, NaN when any element is NaN (as `abs().amax()`), then at least the smallest normal float
// (as `clamp_min(tiny)`: an all-zero row divides to zeros, not NaN).
inline float row_abs_max(const float* x, int64_t k) {
  float top = 0.f;
  bool nan = false;
  int64_t i = 0;
#if RADIXLM_BUILD_AVX512
  // GCC leaves this reduction scalar (a max chain of 3 cycles an element: a microsecond of a 1,536-feature row).
  __m512 lanes = _mm512_setzero_ps();
  __mmask16 unordered = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    lanes = _mm512_max_ps(lanes, _mm512_abs_ps(v));
  }
  nan = unordered != 0;
  top = _mm512_reduce_max_ps(lanes);
#endif
  for (; i < k; ++i) {
    nan = nan || std::isnan(x[i]);
    top = std::max(top, std::fabs(x[i]));
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  return std::max(top, std::numeric_limits<float>::min());
}

}  // namespace radixlm_int8
