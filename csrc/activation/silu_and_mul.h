// The gated MLP's activation of silu_and_mul.cpp, for its dispatcher registration and direct entry point
// (csrc/bindings.cpp).
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// silu(gate) * up for bfloat16 CPU gate_up [..., 2I] (gate the first I features, up the last I): [..., I], computed
// in float32 and rounded once.
at::Tensor silu_and_mul(const at::Tensor& gate_up);

}  // namespace radixlm
