"""DiskKVStore: KV block files of the disk tier (`--kv-offload-dir`), one per block, named by its content key.

A file holds one block of every cache tensor (`PagedKVCache.tensors()`), as raw bytes, behind a header naming the
model identity, the key and the tensors' layout, and ends with a blake2b digest of everything before it. It is
written to a temporary name and renamed, so a crash leaves no half file under a real name. A read checks the
digest, the header and the length before a byte reaches the cache; a file that fails (truncated, corrupt, another
model's or format's) is deleted with a warning and reported, and its tokens are recomputed. A full disk or any
other OSError on a write is reported the same way and costs nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from radixlm.core.disk_tier import FILE_SUFFIX

logger = logging.getLogger(__name__)

MAGIC = b"RADIXKV1"
_DIGEST_BYTES = 32


class BadBlockFile(ValueError):
    pass


class DiskKVStore:
    """Block files in `directory` for blocks of `tensors`' layout (`[num_slots, ...]` each, `block_size` slots a
    block), under model `identity`."""

    def __init__(self, directory: Path, identity: bytes, tensors: list[torch.Tensor], block_size: int) -> None:
        self.directory = directory
        self.identity = identity
        self.layout = [[list(t.shape[1:]), str(t.dtype).removeprefix("torch.")] for t in tensors]
        self.block_size = block_size
        self.block_bytes = [t[0].numel() * t.element_size() * block_size for t in tensors]
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"kv_offload_dir: cannot create {directory}: {error}") from error

    def path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}{FILE_SUFFIX}"

    def _header(self, key: bytes) -> bytes:
        return json.dumps({"identity": self.identity.hex(), "key": key.hex(), "block_size": self.block_size,
                           "layout": self.layout}, sort_keys=True).encode()

    def write(self, key: bytes, blocks: list[torch.Tensor]) -> bool:
        """Write one block (a `[block_size, ...]` slice of each tensor, on the host); False (logged) on an OSError."""
        header = self._header(key)
        body = b"".join([MAGIC, len(header).to_bytes(4, "little"), header,
                         *(block.contiguous().view(torch.uint8).numpy().tobytes() for block in blocks)])
        path = self.path(key)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            temporary.unlink(missing_ok=True)  # a leftover of a crash; O_EXCL below refuses anything in the way
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(body)
                file.write(hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest())
            os.replace(temporary, path)
            return True
        except OSError as error:
            logger.warning("could not write KV block file %s: %s", path, error)
            temporary.unlink(missing_ok=True)
            return False

    def read(self, key: bytes, into: list[torch.Tensor]) -> bool:
        """Fill one block (`into`: a `[block_size, ...]` slice of each host tensor) from its file; False (the file
        deleted, a warning logged) when it is missing, unreadable, or not exactly what this store would write."""
        path = self.path(key)
        expected = len(MAGIC) + 4 + len(self._header(key)) + sum(self.block_bytes) + _DIGEST_BYTES
        try:
            size = path.stat().st_size
            if size != expected:  # before reading: a huge file is not read
                raise BadBlockFile(f"{size} bytes, expected {expected}")
            data = bytearray(path.read_bytes())
            payload = self._check(key, data)
        except (OSError, BadBlockFile) as error:
            logger.warning("ignoring KV block file %s: %s", path, error)
            self.delete(key)
            return False
        offset = 0
        for target, num_bytes in zip(into, self.block_bytes, strict=True):
            raw = torch.frombuffer(payload, dtype=torch.uint8, count=num_bytes, offset=offset)
            target.copy_(raw.view(target.dtype).view(target.shape))
            offset += num_bytes
        return True

    def _check(self, key: bytes, data: bytearray) -> memoryview:
        """The payload of a file's bytes, or BadBlockFile saying what is wrong."""
        if len(data) < len(MAGIC) + 4 + _DIGEST_BYTES or not data.startswith(MAGIC):
            raise BadBlockFile("not a block file (or truncated)")
        body, digest = memoryview(data)[:-_DIGEST_BYTES], bytes(data[-_DIGEST_BYTES:])
        if hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest() != digest:
            raise BadBlockFile("checksum mismatch (corrupt or truncated)")
        header_len = int.from_bytes(body[len(MAGIC):len(MAGIC) + 4], "little")
        header_end = len(MAGIC) + 4 + header_len
        if bytes(body[len(MAGIC) + 4:header_end]) != self._header(key):
            raise BadBlockFile("written for another model, key, block size or layout")
        payload = body[header_end:]
        if len(payload) != sum(self.block_bytes):
            raise BadBlockFile(f"{len(payload)} bytes of K/V, expected {sum(self.block_bytes)}")
        return payload

    def delete(self, key: bytes) -> None:
        try:
            self.path(key).unlink(missing_ok=True)
        except OSError as error:
            logger.warning("could not delete KV block file %s: %s", self.path(key), error)
