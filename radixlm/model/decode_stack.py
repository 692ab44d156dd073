"""Every decoder layer of a decode step in one C++ call (csrc/layers/decode_layers.cpp).

Between its kernels a decode step of a Llama-family model runs Python: each layer's views, slices, attention
lookup, reshapes and module calls (`radixlm.model.fused_ops`), about 60-90 us a layer in a step. Measured inside
steps, much of that is the interpreter starting cold after each kernel has streamed megabytes of weights or K/V
through the caches: the same view, transpose and slice took 25 us right after the q/k/v projection and 4.6 us when
repeated at once (the default model at 32 rows, a Xeon with AMX). A step in which every row decodes therefore runs
the layers' loop in C++: the same kernels, called in the same order on tensors of the same shapes as the Python
layers call them, so the output is the same bit for bit (tests/unit/test_decode_stack.py); the embedding, the rotary
table, the final norm and the LM head stay transformers' and ours in Python.

It runs only where every layer is one `fuse_small_ops` fused with radixlm._C's kernels, its linears in bfloat16 on
the AMX kernel (`Bf16Linear`, the gated MLP's included), on GGUF blocks (`GGUFLinear`, bfloat16 or float32 rows) or in
float32 on the small-batch kernel (`SmallBatchLinear`), with no hooks (LoRA, tensor-parallel shards), over the C++
attention backend with an uncompressed or int8 cache kept as it is (no rotation); any other step or model takes the
Python layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_utils import slice_logits_to_keep

from radixlm.model.attention.cpp_backend import CppAttentionMetadata
from radixlm.model.bf16_linear import AMX, Bf16Linear
from radixlm.model.fused_norm import FusedRMSNorm
from radixlm.model.fused_ops import FusedGatedMLP, runs_fused_forward
from radixlm.model.gguf_linear import AMX_MIN_ROWS, GGUFLinear
from radixlm.model.input_batch import InputBatch
from radixlm.model.ops import direct_kernel, extension_error
from radixlm.model.small_batch import SmallBatchLinear

# csrc/layers/decode_layers.h's LinearKind
KIND_AMX, KIND_AMX_GATED, KIND_GGUF, KIND_SMALL_BATCH = 0, 1, 2, 3
# csrc/layers/decode_layers.h's StackPart, in order: the parts of a layer `part_seconds` times ("gate_up" holds the
# activation too where the gated AMX kernel computes both; "norms": both of a layer's RMSNorms)
STACK_PARTS = ("norms", "qkv", "rotary", "attention", "o_proj", "gate_up", "activation", "down")
ROW_DTYPES = (torch.bfloat16, torch.float32)
MODEL_CLASSES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})


def _hooked(module: nn.Module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def _linear_plan(linear: nn.Module, gated: bool = False) -> tuple[Any, ...] | None:
    """decode_layers.h's Linear as a tuple, or None where the layer runs some other way."""
    if isinstance(linear, Bf16Linear) and linear.kernel == AMX and linear.weight.dtype == torch.bfloat16:
        kind = KIND_AMX_GATED if gated else KIND_AMX
        return kind, linear.weight, linear.bias, linear.row_limit, (), (), (), 0
    if isinstance(linear, GGUFLinear) and linear._kernels is not None and not gated:
        return (KIND_GGUF, None, linear.bias, 0, linear._tiles, linear._types, linear._outs,
                AMX_MIN_ROWS if linear._amx else 0)
    if (isinstance(linear, SmallBatchLinear) and linear._kernel is direct_kernel("small_batch_linear")
            and linear.weight.dtype == torch.float32 and not gated):
        return KIND_SMALL_BATCH, linear.weight, linear.bias, linear.max_rows, (), (), (), 0
    return None


def _norm_plan(norm: nn.Module) -> tuple[torch.Tensor, float] | None:
    if (isinstance(norm, FusedRMSNorm) and norm._kernel is not None and norm._kernel is direct_kernel("rms_norm")
            and norm.weight.dtype in ROW_DTYPES):
        return norm.weight, float(norm.eps)
    return None


def _layer_plan(layer: nn.Module, index: int) -> tuple[Any, ...] | None:
    """decode_layers.h's Layer as a tuple, or None where this layer must run in Python."""
    if not runs_fused_forward(layer) or _hooked(layer):
        return None
    attention, mlp = layer.self_attn, layer.mlp
    if (getattr(attention, "layer_idx", None) != index or attention.rotary_kernel is not direct_kernel("rotary")
            or not isinstance(mlp, FusedGatedMLP)):
        return None
    norms = _norm_plan(layer.input_layernorm), _norm_plan(layer.post_attention_layernorm)
    # Unless gated, bfloat16 rows take radixlm._C's silu_and_mul, float32 rows PyTorch's ops whatever the MLP holds
    # (as FusedGatedMLP does)
    silu = direct_kernel("silu_and_mul")
    activations = (silu,) if layer.input_layernorm.weight.dtype == torch.bfloat16 else (None, silu)
    if mlp._gated:
        gate_up = _linear_plan(mlp.gate_up_proj, gated=True)
    else:
        gate_up = _linear_plan(mlp.gate_up_proj) if mlp._activation in activations else None
    linears = _linear_plan(attention.qkv_proj), _linear_plan(attention.o_proj), gate_up, _linear_plan(mlp.down_proj)
    if None in norms or None in linears:
        return None
    (input_norm, input_eps), (post_norm, post_eps) = norms  # type: ignore[misc]
    scale = attention.scaling if attention.scaling is not None else attention.head_dim ** -0.5
    return (input_norm, input_eps, post_norm, post_eps, *linears, attention.num_heads, attention.num_kv_heads,
            attention.head_dim, float(scale), attention.fused_window or 0)


class DecodeStack:
    """A model's decoder layers as one C++ plan, for the steps in which every row decodes (`runs`)."""

    def __init__(self, model: nn.Module, plan: object, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype  # of the rows between the layers
        self._plan = plan
        self._run = direct_kernel("decode_layers")
        # None, or float64 [len(STACK_PARTS)]: every call adds each part's wall seconds (see `time_parts`)
        self.part_seconds: torch.Tensor | None = None

    @classmethod
    def build(cls, model: nn.Module) -> DecodeStack | None:
        """The stack of `model` (after loading, quantization and `fuse_small_ops`), or None where any part of it
        runs some other way (see the module's docstring)."""
        if extension_error() is not None or type(model).__name__ not in MODEL_CLASSES:
            return None
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None or len(layers) != model.config.num_hidden_layers or not len(layers):
            return None
        plans = [_layer_plan(layer, index) for index, layer in enumerate(layers)]
        if any(plan is None for plan in plans) or len({plan[0].dtype for plan in plans}) != 1:  # type: ignore[index]
            return None
        return cls(model, direct_kernel("decode_plan")(plans), plans[0][0].dtype)  # type: ignore[index]

    def time_parts(self, enabled: bool) -> None:
        """Start (from zero) or stop adding each part's wall seconds to `part_seconds`: the stack's own breakdown
        of a step, for `radixlm bench step` (the C++ loop has no Python modules a probe could wrap). The timers
        are two clock reads a part, tens of nanoseconds."""
        self.part_seconds = torch.zeros(len(STACK_PARTS), dtype=torch.float64) if enabled else None

    def runs(self, batch: InputBatch) -> bool:
        """Whether this step's rows all decode over a cache the plan reads as it is."""
        metadata = batch.attn_metadata
        return (isinstance(metadata, CppAttentionMetadata) and metadata.split is None and not batch.lora_groups
                and metadata.kv_cache.rotation is None and batch.input_ids.device.type == "cpu")

    def logits(self, batch: InputBatch) -> torch.Tensor:
        """The logits transformers' forward returns for this step (`[1, rows, vocab]`)."""
        inner = self.model.model
        hidden = inner.embed_tokens(batch.input_ids)
        if hidden.dtype != self.dtype:
            raise RuntimeError(f"the decode stack runs {self.dtype} rows, got {hidden.dtype}")
        cos, sin = inner.rotary_emb(hidden, position_ids=batch.position_ids)
        metadata = batch.attn_metadata
        assert isinstance(metadata, CppAttentionMetadata)
        cache, tables = metadata.kv_cache, metadata.tables
        hidden = self._run(self._plan, hidden, cos, sin, cache.key_caches, cache.value_caches,
                           cache.key_scales or None, cache.value_scales or None, tables.block_table,
                           tables.block_offsets, tables.context_lens, metadata.slot_mapping, tables.block_size,
                           self.part_seconds)
        hidden = inner.norm(hidden)
        return self.model.lm_head(slice_logits_to_keep(hidden, batch.logits_indices))
