// The decoder layers of a decode step in one call: why and when, radixlm/model/decode_stack.py. Each step below is
// the call radixlm/model/fused_ops.py makes for it (FusedRMSNorm, `_fused_attention_forward`, the attention backend's
// `decode_layer`, `plus_residual`, FusedGatedMLP, Bf16Linear, GGUFLinear), on tensors of the same shapes, so the
// numbers are the same bit for bit (tests/unit/test_decode_stack.py holds that).
#include "decode_layers.h"

#include "../activation/silu_and_mul.h"
#include "../attention/paged_attention.h"
#include "../linear/amx_bf16.h"
#include "../linear/linear.h"
#include "../linear/linear_gguf.h"
#include "../norm/rms_norm.h"
#include "../norm/rotary.h"

#include <chrono>

namespace radixlm::layers {
namespace {

// fn()'s result, its wall time added to `part`'s entry of in.part_seconds when the caller asked for them.
template <typename Fn>
auto timed(const DecodeInputs& in, StackPart part, Fn&& fn) {
  if (in.part_seconds == nullptr) return fn();
  const auto start = std::chrono::steady_clock::now();
  auto result = fn();
  in.part_seconds[part] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// linear(x), plus `residual` when given: Bf16Linear.forward / forward_add, GGUFLinear.forward then `residual + y`.
at::Tensor apply(const Linear& linear, const at::Tensor& x, const c10::optional<at::Tensor>& residual) {
  const int64_t rows = x.numel() / x.size(-1);
  switch (linear.kind) {
    case LinearKind::kAmx: {
      if (rows <= linear.max_rows) return radixlm::amx_bf16_linear(x, linear.weight, linear.bias, residual);
      if (residual.has_value() && !linear.bias.has_value()) {
        const int64_t n = linear.weight.size(0);
        return at::addmm(residual->reshape({-1, n}), x.reshape({-1, x.size(-1)}), linear.weight.t())
            .view(residual->sizes());
      }
      const at::Tensor y = at::linear(x, linear.weight, linear.bias);
      return residual.has_value() ? *residual + y : y;
    }
    case LinearKind::kAmxGated:
      TORCH_CHECK(!residual.has_value(), "decode_layers: a gated linear takes no residual");
      return radixlm::amx_bf16_gated_linear(x, linear.weight);
    case LinearKind::kGguf: {
      const bool amx = linear.gguf_amx_min_rows > 0 && x.scalar_type() == at::kBFloat16 &&
                       rows >= linear.gguf_amx_min_rows;
      const at::Tensor y = radixlm::gguf_linear(x.reshape({-1, x.size(-1)}), linear.tiles, linear.types, linear.outs,
                                                linear.bias, amx ? radixlm::kGgufPathAmx : radixlm::kGgufPathBest);
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
      shape.back() = y.size(-1);
      const at::Tensor out = y.reshape(shape);
      return residual.has_value() ? *residual + out : out;
    }
    case LinearKind::kSmallBatch: {
      const bool kernel = rows <= linear.max_rows && x.scalar_type() == at::kFloat;
      const at::Tensor y = kernel ? radixlm::small_batch_linear(x, linear.weight, linear.bias)
                                  : at::linear(x, linear.weight, linear.bias);
      return residual.has_value() ? *residual + y : y;
    }
  }
  TORCH_CHECK(false, "decode_layers: unknown linear kind");
}

// [1, H, T, D] -> [T, H, D] (a view), as the decode entry point takes transformers' tensors.
at::Tensor rows(const at::Tensor& heads) { return heads.select(0, 0).transpose(0, 1); }

at::Tensor attention_block(const Layer& layer, const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                           const DecodeInputs& in, size_t index) {
  const int64_t tokens = hidden.size(1), hq = layer.num_heads, hkv = layer.num_kv_heads, d = layer.head_dim;
  const at::Tensor x =
      timed(in, kNorms, [&] { return radixlm::rms_norm(hidden, layer.input_norm, layer.input_eps, false); });
  const at::Tensor heads =
      timed(in, kQkv, [&] { return apply(layer.qkv, x, c10::nullopt); }).view({1, tokens, -1, d}).transpose(1, 2);
  const at::Tensor query_key =
      timed(in, kRotary, [&] { return radixlm::rotary(heads.slice(1, 0, hq + hkv), cos, sin); });
  c10::optional<at::Tensor> key_scales, value_scales;
  if (!in.key_scales.empty()) {
    key_scales = in.key_scales[index];
    value_scales = in.value_scales[index];
  }
  const at::Tensor output = timed(in, kAttention, [&] {
    return radixlm::paged_decode_attention(
        rows(query_key.slice(1, 0, hq)), in.key_caches[index], in.value_caches[index], in.block_table,
        in.block_offsets, in.context_lens, in.block_size, layer.scale, layer.sliding_window, 0.0, in.slot_mapping,
        rows(query_key.slice(1, hq)), rows(heads.slice(1, hq + hkv)), key_scales, value_scales);
  });
  return timed(in, kOutput, [&] { return apply(layer.o, output.unsqueeze(0).reshape({1, tokens, hq * d}), hidden); });
}

// The gated kind's gate/up time includes silu(gate) * up: the kernel computes both.
at::Tensor mlp_block(const Layer& layer, const at::Tensor& hidden, const DecodeInputs& in) {
  const at::Tensor x =
      timed(in, kNorms, [&] { return radixlm::rms_norm(hidden, layer.post_norm, layer.post_eps, false); });
  const at::Tensor gate_up = timed(in, kGateUp, [&] { return apply(layer.gate_up, x, c10::nullopt); });
  const at::Tensor activated = timed(in, kActivation, [&] {
    if (layer.gate_up.kind == LinearKind::kAmxGated) return gate_up;  // silu(gate) * up already
    if (gate_up.scalar_type() == at::kBFloat16) return radixlm::silu_and_mul(gate_up, false, false);
    const int64_t half = gate_up.size(-1) / 2;  // FusedGatedMLP's two slices
    return at::silu(gate_up.slice(-1, 0, half)) * gate_up.slice(-1, half);
  });
  return timed(in, kDown, [&] { return apply(layer.down, activated, hidden); });
}

}  // namespace

at::Tensor run_layers(const Plan& plan, at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin,
                      const DecodeInputs& inputs) {
  TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1 &&
                  (hidden.scalar_type() == at::kBFloat16 || hidden.scalar_type() == at::kFloat),
              "decode_layers: hidden must be bfloat16 or float32 [1, T, H]");
  TORCH_CHECK(inputs.key_caches.size() == plan.layers.size() && inputs.value_caches.size() == plan.layers.size(),
              "decode_layers: one key and one value cache per layer");
  TORCH_CHECK(inputs.key_scales.size() == inputs.value_scales.size() &&
                  (inputs.key_scales.empty() || inputs.key_scales.size() == plan.layers.size()),
              "decode_layers: scales for every layer or for none");
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    hidden = attention_block(plan.layers[i], hidden, cos, sin, inputs, i);
    hidden = mlp_block(plan.layers[i], hidden, inputs);
  }
  return hidden;
}

}  // namespace radixlm::layers
