// Where a kernel's [rows, K] bfloat16 rows lie in memory: read with a uniform row stride (no copy for a view whose
// rows are evenly spaced), and written kRowPadding elements apart when K's bytes are a multiple of kAliasBytes:
// rows 1 or 4 KB apart share L1 sets, and a register tile of 12 rows then evicts itself (csrc/linear/bf16_packed).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace radixlm {

constexpr int64_t kAliasBytes = 1024;
constexpr int64_t kRowPadding = 32;  // elements

// The stride (elements) at which a bfloat16 row producer should write `rows` rows of k elements for such a kernel.
inline int64_t padded_row_stride(int64_t rows, int64_t k) {
  return rows > 1 && (k * 2) % kAliasBytes == 0 ? k + kRowPadding : k;
}

// An uninitialised bfloat16 result shaped as x but for its last dimension, n: with pad_rows, its rows as
// padded_row_stride places them (a view of wider rows). `*stride` gets the elements from one row to the next.
inline at::Tensor empty_rows(const at::Tensor& x, int64_t n, bool pad_rows, int64_t* stride) {
  const int64_t rows = x.size(-1) > 0 ? x.numel() / x.size(-1) : 0;
  *stride = pad_rows ? padded_row_stride(rows, n) : n;
  c10::SmallVector<int64_t, 4> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = *stride;
  at::Tensor out = at::empty(sizes, x.options());
  return *stride == n ? out : out.narrow(-1, 0, n);
}

// x's rows of its last dimension as [rows, K] elements `stride` apart: the stride when its last dimension is
// contiguous and its leading ones flatten into one of uniform stride (no row overlapping the next), else 0.
inline int64_t uniform_row_stride(const at::Tensor& x) {
  const int64_t k = x.size(-1);
  if (k > 1 && x.stride(-1) != 1) return 0;
  int64_t stride = -1, rows = 1;  // the stride is set by the innermost leading dimension longer than 1
  for (int64_t i = x.dim() - 2; i >= 0; --i) {
    if (x.size(i) == 1) continue;
    if (stride < 0) {
      stride = x.stride(i);
    } else if (x.stride(i) != stride * rows) {
      return 0;
    }
    rows *= x.size(i);
  }
  if (stride < 0) return k;  // at most one row
  return stride >= k ? stride : 0;  // an expanded (stride 0) or overlapping view is copied
}

}  // namespace radixlm
