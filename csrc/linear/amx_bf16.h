// The bfloat16 linear on AMX tiles (amx_bf16.cpp), for its dispatcher registration and direct Python entry point in
// csrc/bindings.cpp. radixlm/model/amx_linear.py holds the weight layout's pure-PyTorch pack, unpack and reference.
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// Whether this CPU has AMX-BF16 tiles and the OS lets this process use them (asked once, on the first call).
bool amx_bf16_available();

// y = x W^T (+ b) in bfloat16, accumulated in float32: x bfloat16 [..., K]; W packed [N / 32, K / 2, 32, 2] (each
// group of 32 output features stored as K / 2 rows of 32 pairs of consecutive input features, AMX's VNNI layout);
// bias (optional) float32 or bfloat16 [N]. Needs amx_bf16_available().
at::Tensor amx_bf16_linear(const at::Tensor& input, const at::Tensor& packed, const c10::optional<at::Tensor>& bias);

}  // namespace radixlm
