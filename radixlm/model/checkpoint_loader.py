"""Stream an HF safetensors checkpoint into a model, one tensor at a time, layer by layer, for a quantized load.

transformers' `from_pretrained` already reads safetensors tensor by tensor, but it builds the whole model in float
before anything can be quantized: a 3B model asked for in int8 held 12 GB of float32 first. Here the model is built
without weights (parameters on the meta device), the checkpoint's files are memory-mapped (safetensors' `safe_open`)
and read in layer order, and each decoder layer goes to `finish_layer` (fusion and quantization, see
`radixlm.model.serving_format`) as soon as its last tensor is in place. Peak memory is the final footprint plus one
layer in float.

Checkpoint names are the model's own parameter names (Llama, Mistral, Qwen2/3, Gemma checkpoints are saved that way);
a name the model lacks is skipped, and a parameter no file provides is an error naming it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from torch import nn
from tqdm import tqdm
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from radixlm.model.layer_stream import LayerTracker

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files (the index's shards, or the single file); FileNotFoundError if none."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / shard for shard in shards]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    raise FileNotFoundError(f"{model_dir} has no {SINGLE_FILE} or {INDEX_FILE}: radixlm streams safetensors "
                            "checkpoints only")


def _load_order(name: str) -> tuple[int, str]:
    """Layers in order (what is outside the layers first), so layers complete one after another."""
    match = LAYER_INDEX.search(name)
    return (int(match.group(1)) + 1 if match else 0, name)


def build_checkpoint_model(model_dir: Path, config: PretrainedConfig, dtype: torch.dtype, attn_implementation: str,
                           finish_layer: Callable[[nn.Module], None]) -> PreTrainedModel:
    """The model of `config` with its weights read from `model_dir`'s safetensors files in `dtype`, each decoder
    layer handed to `finish_layer` once loaded (see the module docstring)."""
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    expected = {name for name, _ in [*model.named_parameters(), *model.named_buffers()]}
    tracker = LayerTracker(model, finish_layer)
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(path), framework="pt")) for path in safetensors_files(model_dir)]
        names = [(key, handle) for handle in handles for key in handle.keys()]  # noqa: SIM118 (not iterable)
        keys = sorted(names, key=lambda k: _load_order(k[0]))
        for key, handle in tqdm(keys, desc=f"loading {model_dir.name}", unit="tensor", disable=len(keys) < 200):
            if key not in expected:
                logger.debug("checkpoint tensor %s has no place in the model: skipped", key)
                continue
            module_name, _, attr = key.rpartition(".")
            module = model.get_submodule(module_name)
            value = handle.get_tensor(key).to(dtype)
            if attr in module._parameters:
                module._parameters[attr] = nn.Parameter(value, requires_grad=False)
            else:
                module._buffers[attr] = value
            tracker.loaded(key)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    missing = [name for name, value in [*model.named_parameters(), *model.named_buffers()] if value.is_meta]
    if missing:
        raise ValueError(f"{model_dir} lacks tensors for {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    return model
