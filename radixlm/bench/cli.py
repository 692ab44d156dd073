"""`radixlm bench ...` subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _cmd_offline(args: argparse.Namespace) -> None:
    from radixlm.bench.offline import bench_offline
    from radixlm.bench.workload import parse_range
    from radixlm.cli import engine_kwargs

    batch_sizes = [int(b) for b in args.hf_batch_sizes.split(",") if b]
    bench_offline(engine_kwargs(args), args.num_prompts, parse_range(args.input_len), parse_range(args.output_len),
                  batch_sizes, args.workload_seed, args.output_json)


def _cmd_prefix(args: argparse.Namespace) -> None:
    from radixlm.bench.prefix import bench_prefix
    from radixlm.cli import engine_kwargs

    options = engine_kwargs(args)
    options.pop("enable_prefix_caching", None)  # the bench runs both settings
    bench_prefix(options, args.workload_seed, args.random_prompts)


def add_bench_commands(commands: Any) -> None:
    from radixlm.cli import add_engine_args

    bench = commands.add_parser("bench", help="benchmarks against peers in the same run")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    offline = kinds.add_parser("offline", help="random workload: radixlm vs HF generate with static batches")
    offline.add_argument("--num-prompts", type=int, default=64)
    offline.add_argument("--input-len", default="64-512", help="prompt length range LOW-HIGH")
    offline.add_argument("--output-len", default="64-128", help="output length range LOW-HIGH")
    offline.add_argument("--hf-batch-sizes", default="8,16,32", help="comma-separated; empty skips HF")
    offline.add_argument("--workload-seed", type=int, default=0)
    offline.add_argument("--output-json", type=Path, default=None)
    add_engine_args(offline)
    offline.set_defaults(handler=_cmd_offline)

    prefix = kinds.add_parser("prefix", help="multi-turn, shared-prefix and random workloads, radix cache on vs off")
    prefix.add_argument("--workload-seed", type=int, default=0)
    prefix.add_argument("--random-prompts", type=int, default=64, help="size of the 0%%-hit random workload")
    add_engine_args(prefix)
    prefix.set_defaults(handler=_cmd_prefix)
