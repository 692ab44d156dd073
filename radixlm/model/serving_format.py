"""What a loaded model becomes before it serves, one decoder layer at a time: fused small ops, and the weight format
`--quantization` asks for.

A loader that streams a checkpoint (`radixlm.model.gguf_loader`, `radixlm.model.checkpoint_loader`) hands each
decoder layer to `ServingFormat.finish_layer` as soon as all its tensors are in place, so a float copy of at most
one layer exists while loading; `finish_model` then does the rest of the model (final norm, embedding, LM head).

Formats (`--quantization`):
- None: the weights in the model's dtype;
- int8: per-channel int8 weights, per-token int8 activations (`radixlm.model.quantize`);
- gguf: a GGUF file's own blocks, placed by the GGUF loader itself (`radixlm.model.gguf_linear`);
- q4_0, q4_1, q8_0: every linear and the embedding quantized at load to that GGUF block format by gguf-py
  (4-bit with one float16 scale per 32 weights, 4-bit with a scale and a minimum per 32, 8-bit with a scale per
  32), served by the GGUF kernels. The input embedding is quantized too and a tied LM head shares its blocks, as
  in llama.cpp's files.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf import quantize as gguf_quantize
from torch import nn

from radixlm.model.fused_ops import fuse_small_ops, interleave_gated_mlps, pad_rows_for_readers
from radixlm.model.gguf_linear import GGUFEmbedding, GGUFKernels, GGUFLinear, WeightPart
from radixlm.model.huge_pages import HugePageArena
from radixlm.model.prepacked_linear import prepacking_available, use_prepacked_linears
from radixlm.model.quantize import quantize_model
from radixlm.model.small_batch import int8_kernel_is_vectorized, use_small_batch_linears
from radixlm.model.widened_linear import use_widened_linears

logger = logging.getLogger(__name__)

BLOCK_QUANTIZATIONS = {"q4_0": int(GGMLQuantizationType.Q4_0), "q4_1": int(GGMLQuantizationType.Q4_1),
                       "q8_0": int(GGMLQuantizationType.Q8_0)}


def quantize_to_blocks(weight: torch.Tensor, ggml_type: int, kernels: GGUFKernels | None,
                       arena: HugePageArena | None = None) -> WeightPart:
    """A float weight [N, K] as GGUF blocks of `ggml_type` (gguf-py's quantizer), tiled for `kernels` if given (and
    placed in `arena`)."""
    rows = gguf_quantize(weight.detach().float().contiguous().numpy(), GGMLQuantizationType(ggml_type))
    return WeightPart.from_rows(ggml_type, torch.from_numpy(np.ascontiguousarray(rows)), weight.shape[1],
                                packed=kernels is not None, arena=arena)


class ServingFormat:
    """Turns loaded layers into their serving format (see the module docstring)."""

    def __init__(self, quantization: str | None, cpp_kernels: bool, gguf_kernels: GGUFKernels | None) -> None:
        """`cpp_kernels`: radixlm._C's norms, rotary and small-batch linears; `gguf_kernels`: the GGUF linears'
        (None: their PyTorch path)."""
        self.quantization = quantization
        self.cpp_kernels = cpp_kernels
        self.gguf_kernels = gguf_kernels
        self.block_type = BLOCK_QUANTIZATIONS.get(quantization or "")
        self.arena = HugePageArena() if gguf_kernels is not None and self.block_type is not None else None

    def finish_layer(self, layer: nn.Module) -> None:
        """Fuse `layer`'s small ops and put its linears in the serving format, in place."""
        if self.block_type is not None:
            self._to_blocks(layer)  # before fusing: GGUF linears concatenate by parts, without copying
        fuse_small_ops(layer, cpp_kernels=self.cpp_kernels)
        if self.quantization == "int8":
            quantize_model(layer, "int8", small_batch=self.cpp_kernels and int8_kernel_is_vectorized(),
                           fused_scaling=self.cpp_kernels)

    def finish_model(self, model: nn.Module) -> None:
        """Everything outside the decoder layers (the final norm, the embedding, the LM head), the float32 linears'
        small-batch kernels and the bfloat16 linears' prepacked weights (`radixlm.model.prepacked_linear`), or on a
        CPU where oneDNN takes no bfloat16, their widening by blocks (`radixlm.model.widened_linear`)."""
        if self.block_type is not None:
            self._embedding_to_blocks(model)
        self.finish_layer(model)  # what is left; finished layers hold nothing more to fuse or quantize
        if self.quantization is None and self.cpp_kernels:
            logger.debug("%d linears use the small-batch kernels", use_small_batch_linears(model))
            if prepacking_available():
                logger.debug("%d bfloat16 linears prepacked for oneDNN", use_prepacked_linears(model))
                logger.debug("%d norms and activations write padded rows", pad_rows_for_readers(model))
                logger.debug("%d MLPs take silu in their gate/up projection", interleave_gated_mlps(model))
            else:
                logger.debug("%d bfloat16 linears widened by blocks", use_widened_linears(model))

    def _to_blocks(self, root: nn.Module) -> None:
        for name, module in [(n, m) for n, m in root.named_modules() if type(m) is nn.Linear]:
            parent_name, _, child = name.rpartition(".")
            part = quantize_to_blocks(module.weight, self.block_type, self.gguf_kernels, self.arena)
            linear = GGUFLinear([part], module.bias, self.gguf_kernels)
            setattr(root.get_submodule(parent_name) if parent_name else root, child, linear)

    def _embedding_to_blocks(self, model: nn.Module) -> None:
        embedding = model.get_input_embeddings()
        if type(embedding) is not nn.Embedding or embedding.weight.shape[1] % 32:
            return
        part = quantize_to_blocks(embedding.weight, self.block_type, self.gguf_kernels, self.arena)
        head = model.get_output_embeddings()
        tied = head is not None and getattr(head, "weight", None) is embedding.weight
        model.set_input_embeddings(GGUFEmbedding(part, embedding.weight.dtype, self.gguf_kernels))
        if tied:
            model.set_output_embeddings(GGUFLinear([part], head.bias, self.gguf_kernels))
