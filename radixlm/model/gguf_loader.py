"""Stream a GGUF checkpoint into a transformers model, one tensor at a time, in its serving format.

The model is built without weights (accelerate's `init_empty_weights`: parameters on the meta device), then each
tensor of the file is read with plain file reads (no memory map, so the file's pages never count in this process's
memory) and put in place:

- with `keep_blocks` (`--quantization gguf`), a linear layer's weight in a block format radixlm serves packed
  (`radixlm.model.gguf_blocks.BLOCK_FORMATS`) becomes a `GGUFLinear` holding those bytes as they are, and a plain
  embedding table becomes a `GGUFEmbedding`;
- every other tensor is dequantized (radixlm's PyTorch dequantization for those formats, gguf-py's for the
  others) and cast to the model's dtype.

Peak memory while loading is the final footprint plus one tensor in float32. Tensor names and the per-architecture
fixes (Llama's q/k row permutation, Gemma's norm offset) come from transformers' GGUF support; a permutation of
rows applies to packed rows as to float ones, and any other fix makes that tensor load dequantized.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from accelerate import init_empty_weights
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, get_tensor_name_map
from gguf import dequantize as gguf_dequantize
from torch import nn
from tqdm import tqdm
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, LlamaTensorProcessor, TensorProcessor

from radixlm.model.gguf_blocks import BLOCK_FORMATS, dequantize
from radixlm.model.gguf_file import TensorInfo, read_gguf
from radixlm.model.gguf_linear import GGUFEmbedding, GGUFKernels, GGUFLinear, WeightPart
from radixlm.model.huge_pages import HugePageArena
from radixlm.model.layer_stream import LayerTracker

logger = logging.getLogger(__name__)

FLOAT_TYPES = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
               GGMLQuantizationType.BF16: torch.bfloat16}
# Processors whose only change to a weight is a permutation of its rows, valid on packed rows too.
ROW_PERMUTING_PROCESSORS = (TensorProcessor, LlamaTensorProcessor)
PROGRESS_BAR_BYTES = 256 << 20  # files smaller than this load without a progress bar
# transformers model_type -> gguf-py's architecture name, where they differ
GGUF_ARCHITECTURES = {"cohere": "command-r", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
                      "gemma3_text": "gemma3", "gemma4_text": "gemma4"}


def build_gguf_model(gguf_path: Path, config: PretrainedConfig, dtype: torch.dtype, attn_implementation: str,
                     keep_blocks: bool, kernels: GGUFKernels | None = None,
                     finish_layer: Callable[[nn.Module], None] | None = None) -> PreTrainedModel:
    """The model of `config` with its weights read from `gguf_path`; `keep_blocks`: linears and embeddings in a
    served block format stay packed (see the module docstring). `kernels`: radixlm._C's, which `GGUFLinear` then
    calls on tiled weights (None: the PyTorch path on the file's rows). `finish_layer(layer)` is called on each
    decoder layer as soon as all its tensors are loaded (`radixlm.model.layer_stream`)."""
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    tracker = LayerTracker(model, finish_layer)
    contents = read_gguf(gguf_path)
    architecture = str(contents.metadata.get("general.architecture"))
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    name_map = _hf_names(model)
    keep_blocks = keep_blocks and type(processor) in ROW_PERMUTING_PROCESSORS
    total = sum(tensor.num_bytes for tensor in contents.tensors)
    progress = tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {gguf_path.name}",
                    disable=total < PROGRESS_BAR_BYTES)
    arena = HugePageArena() if kernels is not None else None  # the tiles, for a decode step's streaming reads
    with open(gguf_path, "rb") as file, progress:
        for tensor in contents.tensors:
            hf_name = _load_tensor(model, file, tensor, processor, name_map, dtype, keep_blocks, kernels, arena)
            if hf_name is not None:
                tracker.loaded(hf_name)
            progress.update(tensor.num_bytes)
    _tie_output_embeddings(model, kernels)
    missing = [name for name, value in [*model.named_parameters(), *model.named_buffers()] if value.is_meta]
    missing += [f"{name}.bias" for name, module in model.named_modules() if getattr(module, "bias_pending", False)]
    if missing:
        raise ValueError(f"{gguf_path.name} lacks tensors for {', '.join(missing[:8])}"
                         f"{' ...' if len(missing) > 8 else ''}")
    return model


def _hf_names(model: PreTrainedModel) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter or buffer name (gguf-py's name table for the architecture)."""
    model_type = GGUF_ARCHITECTURES.get(model.config.model_type, model.config.model_type)
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == model_type), None)
    if arch is None:
        raise ValueError(f"gguf-py knows no GGUF architecture for model type {model.config.model_type!r}")
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict():
        base, dot, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base) if suffix in ("weight", "bias") else table.get_name(hf_name)
        if gguf_name is not None:
            names[gguf_name + (dot + suffix if suffix in ("weight", "bias") else "")] = hf_name
    return names


def _read(file: object, tensor: TensorInfo) -> np.ndarray:
    """The tensor's bytes, read from the file into memory of our own (uint8, flat)."""
    data = np.empty(tensor.num_bytes, dtype=np.uint8)
    file.seek(tensor.offset)
    if file.readinto(memoryview(data)) != data.size:
        raise ValueError(f"GGUF tensor {tensor.name} is truncated")
    return data


def _load_tensor(model: nn.Module, file: object, tensor: TensorInfo, processor: TensorProcessor,
                 name_map: dict[str, str], dtype: torch.dtype, keep_blocks: bool,
                 kernels: GGUFKernels | None, arena: HugePageArena | None) -> str | None:
    """Put `tensor` in place; returns the model's name for it (None: the model has no place for it)."""
    ggml_type, shape = tensor.ggml_type, list(tensor.shape)
    hf_name = name_map.get(tensor.name)
    if hf_name is None:  # e.g. llama.cpp's precomputed rope_freqs; an architecture that renames is not served
        logger.debug("GGUF tensor %s has no place in the model: skipped", tensor.name)
        return None
    module_name, _, attr = hf_name.rpartition(".")
    module = model.get_submodule(module_name)
    data = _read(file, tensor)
    packable = keep_blocks and ggml_type in BLOCK_FORMATS and attr == "weight" and len(shape) == 2
    if packable and (isinstance(module, nn.Linear) or type(module) is nn.Embedding):
        rows = data.reshape(shape[0], -1)
        rows = np.ascontiguousarray(processor.process(weights=rows, name=tensor.name).weights)
        part = WeightPart.from_rows(ggml_type, torch.from_numpy(rows), shape[1], packed=kernels is not None,
                                    arena=arena)
        parent_name, _, child = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(module, nn.Linear):
            bias = None if module.bias is None or module.bias.is_meta else module.bias
            replacement: nn.Module = GGUFLinear([part], bias, kernels)
            replacement.bias_pending = module.bias is not None and bias is None
        else:
            replacement = GGUFEmbedding(part, dtype, kernels)
        setattr(parent, child, replacement)
        return hf_name
    values = _dequantize(data, ggml_type, shape)
    values = torch.from_numpy(np.ascontiguousarray(processor.process(weights=values, name=tensor.name).weights))
    _set_tensor(module, attr, values.to(dtype))
    return hf_name


def _dequantize(data: np.ndarray, ggml_type: int, shape: list[int]) -> np.ndarray:
    """The tensor's values as a float32 numpy array of HF's `shape`."""
    if ggml_type in FLOAT_TYPES:
        values = torch.from_numpy(data).view(FLOAT_TYPES[ggml_type]).float()
    elif ggml_type in BLOCK_FORMATS:
        rows = torch.from_numpy(data).reshape(-1, data.size // max(1, int(np.prod(shape[:-1]))))
        values = dequantize(rows, ggml_type, shape[-1])
    else:
        values = torch.from_numpy(gguf_dequantize(data, GGMLQuantizationType(ggml_type)).astype(np.float32))
    return values.reshape(shape).numpy()


def _set_tensor(module: nn.Module, attr: str, values: torch.Tensor) -> None:
    if isinstance(module, GGUFLinear) and attr == "bias":
        module.bias = nn.Parameter(values.float(), requires_grad=False)
        module.bias_pending = False
    elif attr in module._parameters:
        module._parameters[attr] = nn.Parameter(values, requires_grad=False)
    else:
        module._buffers[attr] = values


def _tie_output_embeddings(model: PreTrainedModel, kernels: GGUFKernels | None) -> None:
    """A GGUF without `output.weight` ties the LM head to the embedding table: share its blocks or its weight."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or not getattr(model.config, "tie_word_embeddings", False):
        return
    if isinstance(head, GGUFLinear) or (isinstance(head, nn.Linear) and not head.weight.is_meta):
        return
    if isinstance(embedding, GGUFEmbedding):
        model.set_output_embeddings(GGUFLinear([embedding.weight_part], None, kernels))
    else:
        head.weight = embedding.weight

