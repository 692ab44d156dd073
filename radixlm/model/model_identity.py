"""The identity of the K/V a served model computes, for KV block files that outlive the process (the disk tier).

Two servers may share block files only when their K/V for the same tokens are the same numbers: the same weights
(each weight file's name and size, its first and last MiB and 256 pieces of 4 KiB spread evenly over the rest:
about 3 MiB read a file whatever its size, and a re-quantization, a fine-tune or a merged adapter changes tensors
all through the file), the same compute and storage dtypes on the same kind of device, quantization and block
size, and the same file layout version. The
identity starts every block key (`radixlm.core.block_keys`) and names the directory the files live in, so files of
another model are never even looked at.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig
from radixlm.model.device import resolve_device, resolve_dtype
from radixlm.model.loader import gguf_source

KV_FILE_FORMAT = 1
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
_EDGE_BYTES = 1 << 20
_NUM_PIECES = 256
_PIECE_BYTES = 4 << 10


def _weight_files(model_dir: Path) -> list[Path]:
    files = sorted(path for path in model_dir.iterdir() if path.suffix in _WEIGHT_SUFFIXES and path.is_file())
    source = gguf_source(model_dir)
    return [*files, source] if source is not None else files


def _sample(path: Path, digest: hashlib._Hash) -> None:
    """The file's name and size, its first and last MiB and `_NUM_PIECES` pieces spread evenly between them."""
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}:".encode())
    with path.open("rb") as file:
        digest.update(file.read(_EDGE_BYTES))
        inner = max(0, size - 2 * _EDGE_BYTES)
        for piece in range(_NUM_PIECES if inner > _NUM_PIECES * _PIECE_BYTES else 0):
            file.seek(_EDGE_BYTES + piece * inner // _NUM_PIECES)
            digest.update(file.read(_PIECE_BYTES))
        if size > _EDGE_BYTES:
            file.seek(max(_EDGE_BYTES, size - _EDGE_BYTES))
            digest.update(file.read(_EDGE_BYTES))


def model_identity(model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig) -> bytes:
    """32 bytes naming the K/V this model computes and how they are stored (see the module docstring)."""
    digest = hashlib.blake2b(digest_size=32)
    device = resolve_device(model_config.device)
    settings = {"format": KV_FILE_FORMAT, "dtype": str(resolve_dtype(model_config.dtype, device)),
                "device": device.type, "quantization": model_config.quantization,
                "kv_cache_dtype": cache_config.kv_cache_dtype, "block_size": cache_config.block_size,
                "config": (model_dir / "config.json").read_text() if (model_dir / "config.json").is_file() else ""}
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for path in _weight_files(model_dir):
        _sample(path, digest)
    return digest.digest()


def block_file_directory(cache_config: CacheConfig, identity: bytes) -> Path:
    """Where this model's block files live: a directory of its own under `--kv-offload-dir`."""
    assert cache_config.kv_offload_dir is not None
    return Path(cache_config.kv_offload_dir).expanduser() / identity.hex()[:32]
