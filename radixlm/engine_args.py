"""Engine flags from the config fields: `max_num_seqs` -> `--max-num-seqs`, for every command that builds an engine
(`radixlm serve`, `generate`, `debug`, the benchmarks), and back into the config's keyword arguments."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig, ParallelConfig, SchedulerConfig
from radixlm.lora_config import LoRAConfig

ENGINE_CONFIGS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, LoRAConfig)
_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def _parse_field(type_name: str) -> Callable[[str], Any]:
    names = [part.strip() for part in type_name.split("|") if part.strip() != "None"]
    if names == ["float", "str"]:
        return lambda text: float(text) if text.replace(".", "", 1).isdigit() else text
    return _PARSERS[names[0]]


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add one flag per engine config field: `max_num_seqs` -> `--max-num-seqs`."""
    group = parser.add_argument_group("engine")
    for config_cls in ENGINE_CONFIGS:
        for field in dataclasses.fields(config_cls):
            flag = "--" + field.name.replace("_", "-")
            help_text = f"{field.metadata.get('help', '')} (default: {field.default})"
            if field.type == "bool":
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            elif str(field.type).startswith("tuple[str, ...]"):
                group.add_argument(flag, nargs="+", default=None, help=help_text)
            else:
                group.add_argument(flag, type=_parse_field(str(field.type)), default=None, help=help_text)
    group.add_argument("--disable-radix-cache", dest="enable_prefix_caching", action="store_false",
                       help="same as --no-enable-prefix-caching")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options given on the command line (unset flags keep the config defaults)."""
    names = {f.name for config_cls in ENGINE_CONFIGS for f in dataclasses.fields(config_cls)}
    return {name: value for name, value in vars(args).items() if name in names and value is not None}
