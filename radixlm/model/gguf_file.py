"""A GGUF file's table of tensors, read from its header without parsing every metadata value.

gguf-py's `GGUFReader` builds a Python object for every element of every metadata array; a tokenizer of 49k tokens
and merges makes that ~10 s on every load. The loader needs only the tensors (name, type, shape, where the bytes
are) and a few scalar keys, so this reader skips arrays by their lengths. A file is input: every count, length and
offset is checked against the file's size, and a malformed file is a ValueError naming what is wrong.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
# GGUF value type id -> struct format of a scalar; 8 is a string, 9 an array.
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: `shape` in PyTorch's order (rows first), its bytes at `offset` (from the file's
    start), `num_bytes` long."""
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    num_bytes: int


@dataclass(frozen=True)
class GGUFContents:
    tensors: list[TensorInfo]
    metadata: dict[str, object]  # scalar and string values only; arrays are skipped


class _Cursor:
    """Reads the header out of the file's bytes (memory-mapped, so skipping a tokenizer's 100k strings is a loop over
    their lengths, not a read and a seek each)."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.position, self.size = data, 0, len(data)

    def _past_end(self) -> ValueError:
        return ValueError(f"GGUF header runs past the end of the file (at byte {self.position})")

    def read(self, count: int) -> bytes:
        if count < 0 or self.position + count > self.size:
            raise self._past_end()
        self.position += count
        return self.data[self.position - count:self.position]

    def unpack(self, fmt: str) -> object:
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("Q")).decode("utf-8", errors="replace")

    def skip(self, count: int) -> None:
        if count < 0 or self.position + count > self.size:
            raise self._past_end()
        self.position += count

    def skip_strings(self, count: int) -> None:
        """Skips `count` strings (each a u64 length and that many bytes)."""
        if count > (self.size - self.position) // 8:  # each takes 8 bytes at least: no loop of 2^64 empty strings
            raise self._past_end()
        data, position, size, length = self.data, self.position, self.size, _U64.unpack_from
        for _ in range(count):
            if position + 8 > size:
                break
            position += 8 + length(data, position)[0]
        if position > size:
            raise self._past_end()
        self.position = position


def _value(cursor: _Cursor, kind: int) -> object:
    """A scalar or string value; an array is skipped (None)."""
    if kind in SCALAR_FORMATS:
        return cursor.unpack(SCALAR_FORMATS[kind])
    if kind == STRING:
        return cursor.string()
    if kind != ARRAY:
        raise ValueError(f"GGUF metadata value of unknown type {kind}")
    item_kind, count = cursor.unpack("I"), cursor.unpack("Q")
    if item_kind in SCALAR_FORMATS:
        cursor.skip(count * struct.calcsize(SCALAR_FORMATS[item_kind]))
    elif item_kind == STRING:
        cursor.skip_strings(count)
    else:
        raise ValueError(f"GGUF metadata array of unsupported item type {item_kind}")
    return None


def _tensor_bytes(name: str, ggml_type: int, dims: list[int]) -> int:
    try:
        block_weights, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ValueError(f"GGUF tensor {name} has unknown type {ggml_type}") from None
    if dims[0] % block_weights:
        raise ValueError(f"GGUF tensor {name}: rows of {dims[0]} are not whole blocks of {block_weights}")
    count = 1
    for dim in dims[1:]:
        count *= dim
    return count * dims[0] // block_weights * block_bytes


def read_gguf(path: Path) -> GGUFContents:
    """The tensors and scalar metadata of the GGUF file at `path`; ValueError if it is not a well-formed one."""
    size = path.stat().st_size
    if size < len(GGUF_MAGIC):  # also what mmap cannot map (an empty file)
        raise ValueError(f"{path.name} is not a GGUF file")
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if cursor.read(4) != GGUF_MAGIC:
            raise ValueError(f"{path.name} is not a GGUF file")
        version = cursor.unpack("I")
        if version not in (2, 3):
            raise ValueError(f"{path.name}: GGUF version {version} is not supported (2 or 3)")
        num_tensors, num_values = cursor.unpack("Q"), cursor.unpack("Q")
        metadata = {}
        for _ in range(num_values):
            key = cursor.string()
            metadata[key] = _value(cursor, cursor.unpack("I"))
        raw = []
        for _ in range(num_tensors):
            name, num_dims = cursor.string(), cursor.unpack("I")
            if not 1 <= num_dims <= MAX_DIMS:
                raise ValueError(f"GGUF tensor {name} has {num_dims} dimensions")
            dims = [cursor.unpack("Q") for _ in range(num_dims)]
            raw.append((name, dims, cursor.unpack("I"), cursor.unpack("Q")))
        alignment = metadata.get("general.alignment") or DEFAULT_ALIGNMENT
        if not isinstance(alignment, int) or alignment <= 0:
            raise ValueError(f"{path.name}: general.alignment {alignment!r} is not a positive integer")
        data_start = -(-cursor.position // alignment) * alignment
    tensors = []
    for name, dims, ggml_type, relative in raw:
        num_bytes = _tensor_bytes(name, ggml_type, dims)
        offset = data_start + relative
        if offset + num_bytes > size:
            raise ValueError(f"GGUF tensor {name} lies past the end of the file (truncated?)")
        tensors.append(TensorInfo(name, ggml_type, tuple(reversed(dims)), offset, num_bytes))
    return GGUFContents(tensors, metadata)
