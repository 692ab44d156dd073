"""The identity of the K/V a served model computes, for KV block files that outlive the process (the disk tier).

Two servers may share block files only when their K/V for the same tokens are the same numbers: the same weights
(each weight file's name, size and a hash of its first MiB: cheap, and any re-quantization or fine-tune changes
them), the same compute and storage dtypes, quantization and block size, and the same file layout version. The
identity starts every block key (`radixlm.core.block_keys`) and names the directory the files live in, so files of
another model are never even looked at.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig
from radixlm.model.loader import gguf_source

KV_FILE_FORMAT = 1
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
_SAMPLE_BYTES = 1 << 20


def _weight_files(model_dir: Path) -> list[Path]:
    files = sorted(path for path in model_dir.iterdir() if path.suffix in _WEIGHT_SUFFIXES and path.is_file())
    source = gguf_source(model_dir)
    return [*files, source] if source is not None else files


def model_identity(model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig) -> bytes:
    """32 bytes naming the K/V this model computes and how they are stored (see the module docstring)."""
    digest = hashlib.blake2b(digest_size=32)
    settings = {"format": KV_FILE_FORMAT, "dtype": model_config.dtype, "quantization": model_config.quantization,
                "kv_cache_dtype": cache_config.kv_cache_dtype, "block_size": cache_config.block_size,
                "config": (model_dir / "config.json").read_text() if (model_dir / "config.json").is_file() else ""}
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for path in _weight_files(model_dir):
        digest.update(f"{path.name}:{path.stat().st_size}:".encode())
        with path.open("rb") as file:
            digest.update(file.read(_SAMPLE_BYTES))
    return digest.digest()


def block_file_directory(cache_config: CacheConfig, identity: bytes) -> Path:
    """Where this model's block files live: a directory of its own under `--kv-offload-dir`."""
    assert cache_config.kv_offload_dir is not None
    return Path(cache_config.kv_offload_dir).expanduser() / identity.hex()[:32]
