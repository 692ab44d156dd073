"""A PEFT LoRA adapter directory, read and checked against the base model before any tensor is loaded.

The directory holds `adapter_config.json` and `adapter_model.safetensors` (PEFT's `save_pretrained`). Everything is
checked from the config and the safetensors header alone (plain JSON: no tensor is read and no torch is needed),
so that the engine can refuse a bad adapter with one line naming the file and the field before the model worker
sees it: the PEFT type, rank (at most `--max-lora-rank`), scaling, features radixlm does not serve (DoRA, biases,
modules to save, embeddings), and each module's name, dtype and shapes against the base model's projections.

Scaling is PEFT's: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`; `rank_pattern` and
`alpha_pattern` override r and alpha per module, matched as PEFT matches them (the pattern equals the module's
name, or ends it after a dot).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
MAX_PATTERNS = 1024
SAFETENSORS_DTYPES = {"F32": 4, "F16": 2, "BF16": 2}
KEY_PREFIX = "base_model.model."
KEY_PATTERN = re.compile(r"(?P<module>.+)\.lora_(?P<part>[AB])\.weight")
# Config keys whose truthy value asks for something radixlm does not serve.
UNSUPPORTED_OPTIONS = ("use_dora", "lora_bias", "modules_to_save", "layer_replication", "target_parameters",
                       "trainable_token_indices", "alora_invocation_tokens")


class AdapterError(ValueError):
    """A bad adapter: str() names the file and the field."""

    def __init__(self, file: Path, field: str, message: str) -> None:
        super().__init__(f"{file}: {field}: {message}")
        self.field = field


@dataclass(frozen=True)
class AdapterModule:
    """One adapted projection: its module name in the base model, rank, scaling and the two tensors' keys."""

    name: str
    rank: int
    scaling: float
    a_key: str
    b_key: str


@dataclass(frozen=True)
class AdapterFile:
    """A checked adapter: its directory, weights file, largest rank and modules (sorted by name)."""

    path: Path
    weights_path: Path
    rank: int
    modules: tuple[AdapterModule, ...]
    num_bytes: int  # of its tensors in the file


def read_adapter(path: str | Path, target_shapes: Mapping[str, tuple[int, int]], max_rank: int) -> AdapterFile:
    """Check the adapter in directory `path` against the base model's adaptable projections (`target_shapes`:
    module name -> (in_features, out_features)); raises AdapterError naming the file and the field."""
    if "\x00" in str(path):
        raise AdapterError(Path(str(path).replace("\x00", "\\x00")), "lora_path", "holds a NUL character")
    directory = Path(path)
    if not directory.is_dir():
        raise AdapterError(directory, "lora_path", "is not a directory")
    config = _read_config(directory / ADAPTER_CONFIG)
    config_file = directory / ADAPTER_CONFIG
    rank, alpha = _rank_and_alpha(config_file, config, max_rank)
    rank_pattern = _patterns(config_file, config, "rank_pattern")
    alpha_pattern = _patterns(config_file, config, "alpha_pattern")
    weights_path = directory / ADAPTER_WEIGHTS
    header = _read_header(weights_path)
    pairs: dict[str, dict[str, str]] = {}
    for key in header:
        match = KEY_PATTERN.fullmatch(key.removeprefix(KEY_PREFIX)) if key.startswith(KEY_PREFIX) else None
        if match is None:
            raise AdapterError(weights_path, key, "is not a LoRA weight radixlm serves (expected "
                               f"'{KEY_PREFIX}<module>.lora_A.weight' or '.lora_B.weight')")
        pairs.setdefault(match["module"], {})[match["part"]] = key
    if not pairs:
        raise AdapterError(weights_path, "tensors", "the file holds no LoRA weights")
    modules = []
    for name in sorted(pairs):
        module_rank = _pattern_value(rank_pattern, name, rank)
        module_alpha = _pattern_value(alpha_pattern, name, alpha)
        if not isinstance(module_rank, int) or not 1 <= module_rank <= max_rank:
            raise AdapterError(config_file, "rank_pattern", f"rank of {name} must be 1 to {max_rank} "
                               f"(--max-lora-rank), got {module_rank!r}")
        _check_module(weights_path, header, name, pairs[name], module_rank, target_shapes)
        scale_base = math.sqrt(module_rank) if config.get("use_rslora") else module_rank
        modules.append(AdapterModule(name, module_rank, float(module_alpha) / scale_base, pairs[name]["A"],
                                     pairs[name]["B"]))
    num_bytes = sum(_num_bytes(header[key]) for key in header)
    return AdapterFile(directory, weights_path, max(m.rank for m in modules), tuple(modules), num_bytes)


def _read_config(file: Path) -> dict[str, object]:
    if not file.is_file():
        raise AdapterError(file, ADAPTER_CONFIG, "is missing (a PEFT adapter directory holds it)")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise AdapterError(file, ADAPTER_CONFIG, f"is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterError(file, ADAPTER_CONFIG, f"is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise AdapterError(file, ADAPTER_CONFIG, "must hold a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterError(file, "peft_type", f"must be 'LORA', got {peft_type!r}")
    for option in UNSUPPORTED_OPTIONS:
        if config.get(option):
            raise AdapterError(file, option, f"is not supported by radixlm (got {config[option]!r})")
    if config.get("bias", "none") != "none":
        raise AdapterError(file, "bias", f"must be 'none' (radixlm serves no LoRA biases), got {config['bias']!r}")
    if config.get("fan_in_fan_out"):
        raise AdapterError(file, "fan_in_fan_out", "must be false (Conv1D-style weights are not served)")
    return config


def _rank_and_alpha(file: Path, config: Mapping[str, object], max_rank: int) -> tuple[int, float]:
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max_rank:
        raise AdapterError(file, "r", f"must be an integer from 1 to {max_rank} (--max-lora-rank), got {rank!r}")
    alpha = config.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AdapterError(file, "lora_alpha", f"must be a finite number, got {alpha!r}")
    return rank, float(alpha)


def _patterns(file: Path, config: Mapping[str, object], field: str) -> dict[str, object]:
    patterns = config.get(field) or {}
    if not isinstance(patterns, dict) or len(patterns) > MAX_PATTERNS:
        raise AdapterError(file, field, f"must be an object of at most {MAX_PATTERNS} patterns")
    for pattern, value in patterns.items():
        if len(pattern) > 256 or isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise AdapterError(file, field, f"pattern {pattern[:64]!r} must be at most 256 characters with a "
                               f"finite number, got {value!r}")
        try:
            re.compile(pattern)
        except re.error as error:
            raise AdapterError(file, field, f"pattern {pattern[:64]!r} is not a regular expression: {error}") from None
    return patterns


def _pattern_value(patterns: Mapping[str, object], module: str, default: object) -> object:
    """PEFT's rule: the first pattern equal to the module's name or ending it after a dot."""
    for pattern, value in patterns.items():
        if pattern == module or re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def _read_header(file: Path) -> dict[str, dict[str, object]]:
    if not file.is_file():
        raise AdapterError(file, ADAPTER_WEIGHTS, "is missing (radixlm reads PEFT's safetensors file)")
    size = file.stat().st_size
    with file.open("rb") as stream:
        prefix = stream.read(8)
        header_len = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 2 <= header_len <= min(MAX_HEADER_BYTES, size - 8):
            raise AdapterError(file, "header", "is not a safetensors file (bad header length)")
        try:
            header = json.loads(stream.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise AdapterError(file, "header", f"is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise AdapterError(file, "header", "must be a JSON object")
    header.pop("__metadata__", None)
    data_size = size - 8 - header_len
    for key, entry in header.items():
        if not isinstance(entry, dict) or entry.get("dtype") not in SAFETENSORS_DTYPES:
            dtype = entry.get("dtype") if isinstance(entry, dict) else entry
            raise AdapterError(file, key, f"dtype must be one of {sorted(SAFETENSORS_DTYPES)}, got {dtype!r}")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and len(shape) == 2 and all(type(d) is int and d > 0 for d in shape)):
            raise AdapterError(file, key, f"must be a 2-D tensor, got shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size and offsets[1] - offsets[0] == _num_bytes(entry)):
            raise AdapterError(file, key, "its data lies outside the file (truncated or corrupt)")
    return header


def _num_bytes(entry: Mapping[str, object]) -> int:
    shape = entry["shape"]
    assert isinstance(shape, list)
    return math.prod(shape) * SAFETENSORS_DTYPES[str(entry["dtype"])]


def _check_module(file: Path, header: Mapping[str, Mapping[str, object]], name: str, keys: Mapping[str, str],
                  rank: int, target_shapes: Mapping[str, tuple[int, int]]) -> None:
    if set(keys) != {"A", "B"}:
        missing = "lora_B" if "A" in keys else "lora_A"
        raise AdapterError(file, f"{KEY_PREFIX}{name}", f"has no {missing} weight")
    if name not in target_shapes:
        raise AdapterError(file, keys["A"], f"adapts {name!r}, which is not an attention or MLP projection of the "
                           "base model (radixlm adapts those, by their names in the base checkpoint)")
    in_features, out_features = target_shapes[name]
    expected = {"A": [rank, in_features], "B": [out_features, rank]}
    for part, key in keys.items():
        if header[key]["shape"] != expected[part]:
            raise AdapterError(file, key, f"shape must be {expected[part]} (rank {rank}, the base projection is "
                               f"{in_features} -> {out_features}), got {header[key]['shape']}")
