// A decode step's decoder layers in one call (decode_layers.cpp): the Llama-family layer that
// radixlm/model/fused_ops.py runs from Python, step for step, with the same kernels in the same order, for steps in
// which every row decodes. See radixlm/model/decode_stack.py for when it runs and why.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <vector>

namespace radixlm::layers {

// How a linear layer runs: the AMX bfloat16 kernel on the plain weight up to `max_rows` rows (`F.linear` above),
// that kernel's gated form (silu(gate) * up of a weight whose halves are interleaved by 16), the GGUF kernel on
// its tiles (its AMX path for bfloat16 calls of `gguf_amx_min_rows` rows or more; 0: never), or the float32
// small-batch kernel up to `max_rows` rows (`F.linear` above).
enum class LinearKind : int64_t { kAmx = 0, kAmxGated = 1, kGguf = 2, kSmallBatch = 3 };

struct Linear {
  LinearKind kind = LinearKind::kAmx;
  at::Tensor weight;  // kAmx, kAmxGated: [N, K] bfloat16; kSmallBatch: float32
  c10::optional<at::Tensor> bias;
  int64_t max_rows = 0;                   // kAmx, kSmallBatch
  std::vector<at::Tensor> tiles;          // kGguf: one per part
  std::vector<int64_t> types, outs;       // kGguf: each part's ggml type and out_features
  int64_t gguf_amx_min_rows = 0;          // kGguf
};

// One pre-norm decoder layer: RMSNorm, q/k/v as one linear, rotary embedding, paged attention, o projection plus
// the residual, RMSNorm, gated MLP (gate/up as one linear; silu(gate) * up by radixlm._C's kernel for bfloat16 rows,
// by PyTorch's ops for float32 ones, as FusedGatedMLP does), down projection plus the residual.
struct Layer {
  at::Tensor input_norm, post_norm;
  double input_eps = 0.0, post_eps = 0.0;
  Linear qkv, o, gate_up, down;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, sliding_window = 0;
  double scale = 0.0;
};

struct Plan {
  std::vector<Layer> layers;
};

// The parts of a layer whose wall time a caller may ask for (radixlm/model/decode_stack.py's STACK_PARTS, in order).
enum StackPart : int64_t {
  kNorms = 0, kQkv, kRotary, kAttention, kOutput, kGateUp, kActivation, kDown, kNumStackParts
};

// The step's K/V caches and block tables, as the paged decode kernel takes them (csrc/attention/paged_attention.h).
struct DecodeInputs {
  std::vector<at::Tensor> key_caches, value_caches, key_scales, value_scales;  // scales: empty unless int8
  at::Tensor block_table, block_offsets, context_lens, slot_mapping;
  int64_t block_size = 0;
  // [kNumStackParts] or null: each part's wall seconds over all layers are added here (`radixlm bench step`).
  double* part_seconds = nullptr;
};

// hidden [1, T, H] (bfloat16, or float32 for float32 models) through every layer of `plan`, each row a decode at
// its own position (cos and sin: the rows' rotary embedding, [1, T, D]); returns the last layer's output.
at::Tensor run_layers(const Plan& plan, at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin,
                      const DecodeInputs& inputs);

}  // namespace radixlm::layers
