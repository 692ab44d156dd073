"""Parsing and help of config values shared by the config dataclasses (`radixlm.config`, `radixlm.cache_config`):
memory budgets and byte sizes, JSON objects given on the command line, and the help text a field carries."""

from __future__ import annotations

import json
import re

_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
               "g": 1e9, "gb": 1e9, "gib": 2**30}


def parse_memory(value: float | int | str, name: str = "kv_cache_memory") -> float:
    """Parse a memory budget: a fraction of free memory (0 < x <= 1) or a byte count ("512MiB", "2GB", 3e8)."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if match is None or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"{name} must be a fraction in (0, 1] or a size like '512MiB', got {value!r}")
        number = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number or a size like '512MiB', got {value!r}")
    else:
        number = float(value)
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{name} must be > 0 and finite, got {value!r}")
    return number


def parse_bytes(value: int | str, name: str) -> int:
    """A byte count given as a number or a size ("512MiB", "2GB"); ValueError naming `name` unless it is a whole
    number of bytes in [1 MiB, 1 TiB]."""
    number = parse_memory(value, name)
    if not 2**20 <= number <= 2**40:
        raise ValueError(f"{name} must be between 1MiB and 1TiB, got {value!r}")
    return int(number)


def parse_json_object(value: str | dict[str, object], name: str) -> dict[str, object]:
    """A JSON object given as text or as a dict; a ValueError naming `name` otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{name} is not valid JSON: {error}") from None
        except RecursionError:  # nesting beyond the parser's recursion limit
            raise ValueError(f"{name} is nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


def help_text(text: str) -> dict[str, str]:
    return {"help": text}
