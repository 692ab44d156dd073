// The gated MLP's activation of silu_and_mul.cpp, for its dispatcher registration and direct entry point
// (csrc/bindings.cpp).
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// silu(gate) * up for bfloat16 CPU gate_up [..., 2I] (gate the first I features, up the last I): [..., I], computed
// in float32 and rounded once. With pad_rows, several rows whose bytes are a multiple of 1 KB come as a view of
// wider rows (csrc/row_layout.h), which bf16_packed_linear reads without copying them apart. With blocks16 the two
// halves alternate in blocks of 16 features instead (gate 0-15, up 0-15, gate 16-31, ...; I a multiple of 16).
at::Tensor silu_and_mul(const at::Tensor& gate_up, bool pad_rows = false, bool blocks16 = false);

}  // namespace radixlm
