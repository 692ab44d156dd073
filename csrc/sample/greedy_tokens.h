// The greedy sampler's argmax of greedy_tokens.cpp, for its dispatcher registration and direct entry point
// (csrc/bindings.cpp).
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// For float32 CPU logits [N, V] (rows with contiguous values, any row stride): each row's index of its largest
// value, the first on ties, NaN counting as -inf; a row with no value above -inf gives 0 (as the argmax of a row of
// -inf does). int64 [N]. radixlm/sample/finite.py's `greedy_tokens` holds the PyTorch reference.
at::Tensor greedy_tokens(const at::Tensor& logits);

}  // namespace radixlm
