"""Fewer, fused small ops in the decoder layers of Llama-family models (Llama, Mistral, Qwen2, Qwen3's norms and MLP).

A decode step at batch 1 runs about fifty small ops per layer, each paying framework overhead. Applied at load time
(before any quantization), this replaces, for the module classes it knows:

- RMSNorm: one call instead of seven ops, bitwise equal in float32: radixlm._C's `rms_norm` (with `cpp_kernels`,
  about 1.5 us a call at one row) or `F.rms_norm` (about 7 us: PyTorch runs it as ten small ops);
- MLP: gate and up projections as one matmul (one weight `[2I, H]`), `silu(gate) * up` (in bfloat16 with
  `cpp_kernels`: radixlm._C's `silu_and_mul`, one pass), down projection;
- attention (Llama, Mistral, Qwen2): q, k and v as one matmul, and rotary embedding applied to q and k together,
  in one call of radixlm._C's `rotary` (with `cpp_kernels`) or with a roll instead of slicing, negating and
  concatenating (either way the same products and sums as transformers');
- the decoder layer (Llama, Mistral, Qwen2), once its norms, attention and MLP are all fused: the same steps, with
  those four modules' forwards called directly rather than through the module-call machinery.

The kernels take float32 rows (bit-identical to the PyTorch ops) and bfloat16 rows (computed in float32 and rounded
once, where PyTorch's bfloat16 ops round each step: a bfloat16 step apart at most). In a bfloat16 step of the default
model they replaced 61 norms, 30 rotary embeddings and 30 activations that took 2-5x as long (csrc/norm,
csrc/activation: timings there).

Other classes keep transformers' code. Attention still goes through the function registered with transformers.
Under tensor parallelism the fused projections hold this rank's shards (whole heads, whole MLP columns): the norms
are replicated, and the sharded o_proj and down_proj keep transformers' hooks that sum the ranks' outputs.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from radixlm.model.bf16_linear import AMX, Bf16Linear
from radixlm.model.fused_norm import FusedRMSNorm
from radixlm.model.gguf_linear import GGUFLinear
from radixlm.model.ops import direct_kernel, extension_error

NORM_CLASSES = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
MLP_CLASSES = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
DECODER_LAYER_CLASSES = frozenset({"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"})
# attention class -> its sliding window (transformers passes it to the attention function as a keyword)
ATTENTION_CLASSES: dict[str, Callable[[nn.Module], int | None]] = {
    "LlamaAttention": lambda module: None,
    "MistralAttention": lambda module: getattr(module.config, "sliding_window", None),
    "Qwen2Attention": lambda module: module.sliding_window,
}


KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # what radixlm._C's rms_norm and rotary take


def _cpp_kernel(name: str, weight: torch.Tensor | None,
                dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES) -> Callable[..., torch.Tensor] | None:
    """radixlm._C's function `name` (a direct entry point) for a module whose weight is `weight`, when that is a CPU
    tensor of one of `dtypes` (not a tensor-parallel DTensor) and the extension is built; else None. `weight` None: the
    module reads a GGUF linear's output (on the CPU, in the rows' dtype, which the caller checks on every call)."""
    if weight is not None and (isinstance(weight, DTensor) or weight.dtype not in dtypes
                               or weight.device.type != "cpu"):
        return None
    return None if extension_error() is not None else direct_kernel(name)


class FusedGatedMLP(nn.Module):
    """`down(silu(gate(x)) * up(x))` with gate and up as one linear layer."""

    def __init__(self, gate: nn.Linear, up: nn.Linear, down: nn.Linear, cpp_kernels: bool = False) -> None:
        """`cpp_kernels`: bfloat16 CPU rows take radixlm._C's `silu_and_mul` (when it is built)."""
        super().__init__()
        self.gate_up_proj = _concat_linears(gate, up)
        self.down_proj = down
        weight = None if isinstance(gate, GGUFLinear) else gate.weight  # a GGUF linear has no weight tensor
        self._activation = _cpp_kernel("silu_and_mul", weight, (torch.bfloat16,)) if cpp_kernels else None
        self._gated = False  # bfloat16 rows take gate_up_proj.forward_gated (`interleave_halves`)

    def interleave_halves(self) -> bool:
        """When gate_up_proj is a bias-free `Bf16Linear` on the AMX kernel: reorder its weight's rows so that the gate
        and up halves alternate in blocks of 16, and run bfloat16 rows through `amx_bf16_gated_linear` (silu(gate) *
        up in the kernel's own writes: no pass over the [rows, 2I] projection, whose two halves the threads wrote by
        columns, and no rounding of it; the kernel takes prefill-sized calls in chunks of rows); whether it did. The
        rows move in place (a weight on huge pages stays there)."""
        gate_up = self.gate_up_proj
        if (self._gated or self._activation is None or not isinstance(gate_up, Bf16Linear)
                or gate_up.kernel != AMX or gate_up.bias is not None or isinstance(gate_up.weight, DTensor)
                or gate_up.out_features % 32):
            return False
        _reorder_halves(gate_up.weight, to_blocks=True)
        self._gated = True
        self._activation = direct_kernel("silu_and_mul_blocks16")
        return True

    def restore_halves(self) -> None:
        """Undo `interleave_halves` (LoRA adapters add their deltas to the two halves)."""
        if not self._gated:
            return
        _reorder_halves(self.gate_up_proj.weight, to_blocks=False)
        self._gated = False
        self._activation = direct_kernel("silu_and_mul")

    def pad_rows(self) -> bool:
        """Write the activation's rows that the packed linear would copy apart already apart
        (`pad_rows_for_readers`); whether the kernel does."""
        if self._activation is None:
            return False
        self._activation = direct_kernel("silu_and_mul_padded")
        return True

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP's output, plus `residual` when given (`plus_residual`)."""
        if self._gated and x.numel() and x.dtype == torch.bfloat16 and not torch.is_grad_enabled():
            return plus_residual(self.down_proj, self.gate_up_proj.forward_gated(x), residual)
        gate_up = self.gate_up_proj(x)
        if self._activation is not None and gate_up.dtype == torch.bfloat16 and not torch.is_grad_enabled():
            return plus_residual(self.down_proj, self._activation(gate_up), residual)
        if self._gated:  # the halves interleaved by 16 (`interleave_halves`)
            blocks = gate_up.unflatten(-1, (-1, 2, 16))
            gate, up = blocks[..., 0, :].flatten(-2), blocks[..., 1, :].flatten(-2)
        else:
            half = gate_up.shape[-1] // 2  # two slices: `chunk` costs twice as much per call (split, narrow)
            gate, up = gate_up[..., :half], gate_up[..., half:]
        return plus_residual(self.down_proj, F.silu(gate) * up, residual)


def _reorder_halves(weight: torch.Tensor, to_blocks: bool) -> None:
    """In place: a gate/up weight's rows from its two halves (gate, then up) to blocks of 16 rows taken from each in
    turn (`to_blocks`), or back."""
    half_blocks, width = weight.shape[0] // 32, weight.shape[1]
    shape = (2, half_blocks, 16, width) if to_blocks else (half_blocks, 2, 16, width)
    with torch.no_grad():
        weight.copy_(weight.view(shape).transpose(0, 1).reshape(-1, width))


def plus_residual(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """`residual + linear(x)` (`linear(x)` when `residual` is None), in the linear's own writes where it has
    `forward_add` (`Bf16Linear`) and no hooks (a tensor-parallel shard's hook sums the ranks' outputs, which must come
    before the add)."""
    if residual is None:
        return linear(x)
    forward_add = getattr(linear, "forward_add", None)
    if forward_add is not None and not linear._forward_hooks and not linear._forward_pre_hooks \
            and not torch.is_grad_enabled():
        return forward_add(x, residual)
    return residual + linear(x)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a tensor-parallel (DTensor) parameter, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _concat_linears(*linears: nn.Module) -> nn.Module:
    """One linear layer computing the outputs of `linears` side by side. Under tensor parallelism the inputs are
    column-sharded (each rank holds some output features of each), so the local shards are concatenated: the
    result computes this rank's outputs of each, in order, which is what the sharded modules computed. GGUF
    linears concatenate their blocks (`GGUFLinear.concat`)."""
    if all(isinstance(linear, GGUFLinear) for linear in linears):
        return GGUFLinear.concat(linears)
    if any(isinstance(linear, GGUFLinear) for linear in linears):
        return StackedLinears(linears)  # a GGUF file whose tensors mix packed and float formats
    weights = [_local(lin.weight) for lin in linears]
    has_bias = linears[0].bias is not None
    # On the meta device, then the concatenations as its parameters: no random initialisation to overwrite (a
    # third of the default model's load once) and no second copy of each fused matrix.
    fused = nn.Linear(weights[0].shape[1], sum(w.shape[0] for w in weights), bias=has_bias, device="meta")
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat(weights), requires_grad=False)
        if has_bias:
            fused.bias = nn.Parameter(torch.cat([_local(lin.bias) for lin in linears]), requires_grad=False)
    return fused


class StackedLinears(nn.Module):
    """Linear layers of different kinds run one after the other, their outputs side by side."""

    def __init__(self, linears: tuple[nn.Module, ...]) -> None:
        super().__init__()
        self.linears = nn.ModuleList(linears)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([linear(x) for linear in self.linears], dim=-1)


def _fused_attention_forward(self: nn.Module, hidden_states: torch.Tensor,
                             position_embeddings: tuple[torch.Tensor, torch.Tensor],
                             attention_mask: torch.Tensor | None = None, past_key_values: object = None,
                             residual: torch.Tensor | None = None, **kwargs: object) -> tuple[torch.Tensor, None]:
    if past_key_values is not None:
        raise RuntimeError("fused attention keeps no transformers cache: call the model with use_cache=False")
    kwargs.pop("position_ids", None)
    kwargs.pop("use_cache", None)
    lead = hidden_states.shape[:-1]
    head_dim, num_heads, num_kv_heads = self.head_dim, self.num_heads, self.num_kv_heads
    qkv = self.qkv_proj(hidden_states).view(*lead, -1, head_dim).transpose(-3, -2)  # [B, Hq + 2 Hkv, T, D]
    query_key = qkv[:, :num_heads + num_kv_heads]
    if (self.rotary_kernel is not None and query_key.dtype == position_embeddings[0].dtype
            and not torch.is_grad_enabled()):
        query_key = self.rotary_kernel(query_key, *position_embeddings)
    else:
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        half = head_dim // 2
        rotated = query_key.roll(half, dims=-1) * sin  # rotate_half(x) * sin, but with the first half not negated
        rotated[..., :half].neg_()
        query_key = query_key * cos + rotated
    attention = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
    output, _ = attention(self, query_key[:, :num_heads], query_key[:, num_heads:], qkv[:, num_heads + num_kv_heads:],
                          attention_mask, dropout=0.0, scaling=self.scaling, sliding_window=self.fused_window,
                          **kwargs)
    return plus_residual(self.o_proj, output.reshape(*lead, -1), residual), None


def _fused_decoder_layer_forward(self: nn.Module, hidden_states: torch.Tensor,
                                 attention_mask: torch.Tensor | None = None, position_ids: object = None,
                                 past_key_values: object = None, use_cache: object = None,
                                 position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                                 **kwargs: object) -> torch.Tensor:
    """transformers' pre-norm decoder layer, step for step, with its fused submodules' forwards called directly: a
    module call (`nn.Module.__call__`'s hook checks and dispatch) costs microseconds, 120 of them a decode step on the
    default model. Batch-1 decode, the two forwards alternated in one process (Zen 4, 2026-12-06): the default model
    18.44 -> 18.25 ms a token in float32 and 13.13 -> 13.05 in bfloat16, a 1B Q4_K_M file 21.69 -> 21.27."""
    if position_embeddings is None:
        raise RuntimeError("fused decoder layers need the model's position embeddings")
    # Each residual add happens in the projection before it (`plus_residual`).
    hidden_states, _ = self.self_attn.forward(self.input_layernorm.forward(hidden_states), position_embeddings,
                                              attention_mask, past_key_values=past_key_values,
                                              residual=hidden_states, **kwargs)
    return self.mlp.forward(self.post_attention_layernorm.forward(hidden_states), residual=hidden_states)


def _fuse_decoder_layer(layer: nn.Module) -> bool:
    """Give a decoder layer whose norms, attention and MLP are all fused the direct forward; whether it got it."""
    fused = (isinstance(getattr(layer, "input_layernorm", None), FusedRMSNorm)
             and isinstance(getattr(layer, "post_attention_layernorm", None), FusedRMSNorm)
             and isinstance(getattr(layer, "mlp", None), FusedGatedMLP)
             and hasattr(getattr(layer, "self_attn", None), "qkv_proj"))
    if fused:
        layer.forward = types.MethodType(_fused_decoder_layer_forward, layer)
    return fused


def runs_fused_forward(layer: nn.Module) -> bool:
    """Whether `layer` runs `_fused_decoder_layer_forward` (`fuse_small_ops` gave it the direct forward)."""
    return getattr(layer.forward, "__func__", None) is _fused_decoder_layer_forward


def _local_out_features(linear: nn.Module) -> int:
    """This rank's output features of a linear layer (a GGUF one is never sharded)."""
    return linear.out_features if isinstance(linear, GGUFLinear) else _local(linear.weight).shape[0]


def _fuse_attention(module: nn.Module, sliding_window: int | None, cpp_kernels: bool) -> None:
    module.qkv_proj = _concat_linears(module.q_proj, module.k_proj, module.v_proj)
    # A GGUF projection computes in float32 on the CPU, which the rotary kernel takes.
    weight = module.qkv_proj.weight if isinstance(module.qkv_proj, nn.Linear) else None
    module.rotary_kernel = _cpp_kernel("rotary", weight) if cpp_kernels else None
    module.num_heads = _local_out_features(module.q_proj) // module.head_dim  # this rank's heads
    module.num_kv_heads = _local_out_features(module.k_proj) // module.head_dim
    module.fused_window = sliding_window
    del module.q_proj, module.k_proj, module.v_proj
    module.forward = types.MethodType(_fused_attention_forward, module)


def fuse_small_ops(model: nn.Module, cpp_kernels: bool = False) -> int:
    """Replace the norms, MLPs and attention blocks `model` has fused versions of, in place; returns how many
    (modules fused by an earlier call are left as they are). `cpp_kernels`: float32 and bfloat16 CPU norms and rotary
    embeddings, and bfloat16 MLP activations, run radixlm._C's kernels (when it is built)."""
    replaced = 0
    # Names, not modules: a list of the modules would keep every replaced projection alive until the end (for
    # packed or float weights alike, a second copy of every fused matrix at the peak).
    for name in [name for name, _ in model.named_modules()]:
        try:
            module = model.get_submodule(name)
        except AttributeError:  # inside a module replaced earlier in this loop
            continue
        kind = type(module).__name__
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if kind in NORM_CLASSES:
            kernel = _cpp_kernel("rms_norm", module.weight) if cpp_kernels else None
            setattr(parent, child, FusedRMSNorm(module.weight, module.variance_epsilon, kernel))
        elif kind in MLP_CLASSES and getattr(getattr(module, "config", None), "hidden_act", None) == "silu":
            setattr(parent, child, FusedGatedMLP(module.gate_proj, module.up_proj, module.down_proj, cpp_kernels))
        elif kind in ATTENTION_CLASSES and module.head_dim % 2 == 0 and not hasattr(module, "qkv_proj"):
            _fuse_attention(module, ATTENTION_CLASSES[kind](module), cpp_kernels)
        else:
            continue
        replaced += 1
    # After their children: a layer's own forward is replaced only once all four of them are fused ones (a layer
    # given it by an earlier call is left as it is).
    for module in model.modules():
        if type(module).__name__ in DECODER_LAYER_CLASSES and "forward" not in vars(module):
            replaced += _fuse_decoder_layer(module)
    return replaced


def pad_rows_for_readers(model: nn.Module) -> int:
    """Once the linears have their final classes: each fused norm or activation whose one reader takes evenly spaced
    rows (`reads_strided_rows`: the packed bfloat16 linear) writes the rows that reader would copy apart already apart
    (csrc/row_layout.h: rows 1 KB multiples long, as in every model with a hidden size a multiple of 512). The input
    norm's reader is the fused q/k/v projection, the post-attention norm's the MLP's gate/up projection, the
    activation's the down projection. Any other reader still gets correct numbers from such a view. Returns how
    many now pad."""
    padded = 0
    for module in model.modules():
        pairs: list[tuple[nn.Module, nn.Module | None]] = []
        if isinstance(module, FusedGatedMLP):
            pairs.append((module, module.down_proj))
        attention, mlp = getattr(module, "self_attn", None), getattr(module, "mlp", None)
        norm = getattr(module, "input_layernorm", None)
        if isinstance(norm, FusedRMSNorm) and attention is not None:
            pairs.append((norm, getattr(attention, "qkv_proj", None)))
        norm = getattr(module, "post_attention_layernorm", None)
        if isinstance(norm, FusedRMSNorm) and isinstance(mlp, FusedGatedMLP):
            pairs.append((norm, mlp.gate_up_proj))
        padded += sum(getattr(reader, "reads_strided_rows", False) and producer.pad_rows()
                      for producer, reader in pairs)
    return padded


def interleave_gated_mlps(model: nn.Module) -> int:
    """Once the linears have their final classes: every `FusedGatedMLP` whose gate/up projection runs on the AMX
    kernel computes silu(gate) * up in that kernel's writes (`FusedGatedMLP.interleave_halves`). Returns how many."""
    return sum(module.interleave_halves() for module in model.modules() if isinstance(module, FusedGatedMLP))
