"""`radixlm bench ...` subcommands: the benchmarks users run (serve, offline, peers, spec, step, quality, soak).
The one-off investigations (attention, evict, prefix, structured, sampler, trace cost) are scripts in the
checkout's top-level `benchmarks/`, outside the package."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _cmd_offline(args: argparse.Namespace) -> None:
    from radixlm.bench.offline import bench_offline
    from radixlm.bench.workload import parse_range
    from radixlm.engine_args import engine_kwargs

    batch_sizes = [int(b) for b in args.hf_batch_sizes.split(",") if b]
    bench_offline(engine_kwargs(args), args.num_prompts, parse_range(args.input_len), parse_range(args.output_len),
                  batch_sizes, args.workload_seed, args.output_json, args.compare_data_parallel,
                  args.compare_tensor_parallel)


def _cmd_serve(args: argparse.Namespace) -> None:
    from radixlm.bench.serve import BenchOptions, bench_serve
    from radixlm.bench.serve_workloads import WORKLOADS, WorkloadSpec
    from radixlm.bench.workload import parse_range
    from radixlm.engine_args import engine_kwargs

    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    spec = WorkloadSpec(args.num_prompts, parse_range(args.input_len), parse_range(args.output_len), args.prefix_len,
                        args.workload_seed, args.num_users, args.num_rounds)
    if not 0 <= args.lora <= 64 or not 1 <= args.lora_rank <= 1024:
        raise ValueError("--lora must be 0 to 64 and --lora-rank 1 to 1024")
    options = BenchOptions(workloads, spec, args.request_rate, args.max_concurrency, args.output_json,
                           args.output_png, extra={"api_key": args.api_key}, num_loras=args.lora,
                           lora_rank=args.lora_rank)
    if args.restart:
        from radixlm.bench.serve_restart import bench_serve_restart

        if args.base_url is not None:
            raise ValueError("--restart starts its own servers: not with --base-url")
        bench_serve_restart(engine_kwargs(args), options)
        return
    bench_serve(args.base_url, engine_kwargs(args), options)


def _cmd_soak(args: argparse.Namespace) -> None:
    from radixlm.bench.soak import bench_soak
    from radixlm.bench.soak_attack import HostileOptions
    from radixlm.engine_args import engine_kwargs

    for name in ("hostile_requests", "hostile_concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if not 0.001 <= args.tiny_interval <= 10:
        raise ValueError("--tiny-interval must be between 0.001 and 10 seconds")
    hostile = (HostileOptions(args.hostile_requests, args.hostile_concurrency, args.tiny_interval)
               if args.hostile else None)
    if not bench_soak(args.base_url, engine_kwargs(args), args.num_requests, args.concurrency, args.workload_seed,
                      hostile, lora=args.lora_churn):
        raise SystemExit(1)


SPEC_BASE = "--num-threads 2 --quantization int8"
SPEC_CONFIG = '{"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_max": 5, "prompt_lookup_min": 2}'


def _add_side_by_side_args(parser: argparse.ArgumentParser, radixlm_sets: str, cases: str) -> None:
    """`bench peers` and `bench spec`: radixlm flag sets and llama-server, one server at a time, the same cases."""
    parser.add_argument("--radixlm", default=radixlm_sets,
                        help="';'-separated radixlm serve flag sets, one server each")
    parser.add_argument("--cases", default=cases, help="comma-separated WORKLOAD@CONCURRENCY:REQUESTS")
    parser.add_argument("--peer-script", default="../shared/peers/serve-llama-server.sh",
                        help="starts llama-server on the port given as its argument (empty: no peer)")
    parser.add_argument("--peer-port", type=int, default=8002)
    parser.add_argument("--peer-name", default="llama-server",
                        help="the peer's column (scripts/serve-vllm-peer.sh starts vLLM's CPU build: name it vllm)")
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="a .gguf file both servers load (radixlm sets without --model get it; the peer via "
                             "GGUF=); default: the default model")
    parser.add_argument("--input-len", default="64-256", help="the random workload's prompt tokens, LOW-HIGH")
    parser.add_argument("--output-len", default=None, help="the random workload's output tokens, LOW-HIGH "
                                                           "(default 64-64)")
    parser.set_defaults(handler=_cmd_peers)


def _cmd_peers(args: argparse.Namespace) -> None:
    from radixlm.bench.peers import Case, bench_peers

    cases = [Case.parse(text) for text in args.cases.split(",") if text]
    bench_peers([s for s in args.radixlm.split(";")], cases, args.peer_script or None, args.peer_port,
                args.workload_seed, args.model, args.input_len, args.output_len, args.peer_name)


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def _cmd_step(args: argparse.Namespace) -> None:
    from radixlm.bench.step import QUICK_GRID, StepGrid, bench_step
    from radixlm.bench.step_prefill import bench_prefill
    from radixlm.engine_args import engine_kwargs

    prefix_modes = {"none": (False,), "shared": (True,), "both": (False, True)}[args.prefix]
    if args.quick:
        grid = StepGrid(QUICK_GRID.batch_sizes, QUICK_GRID.context_lens, prefix_modes, QUICK_GRID.num_steps)
    else:
        grid = StepGrid(_int_list(args.batch_sizes), _int_list(args.context_lens), prefix_modes, args.num_steps)
    if grid.batch_sizes:
        bench_step(engine_kwargs(args), grid, args.workload_seed)
    prefill_lens = (256,) if args.quick else _int_list(args.prefill_lens)
    if prefill_lens:
        print("\none prompt's prefill, one chunk:")
        bench_prefill(engine_kwargs(args), prefill_lens, grid.num_steps, args.workload_seed)


def _cmd_quality(args: argparse.Namespace) -> None:
    from radixlm.bench.quality import bench_quality
    from radixlm.engine_args import engine_kwargs

    bench_quality(engine_kwargs(args), args.num_prompts, args.num_tokens, args.window,
                  reference_model=args.reference_model, reference_kv_cache_dtype=args.reference_kv_cache_dtype)


def add_bench_commands(commands: Any) -> None:
    """Add `bench` and its subcommands to `commands` (an argparse subparsers action); each sets `handler`."""
    bench = commands.add_parser("bench", help="benchmarks against peers in the same run")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    _add_offline(kinds)
    _add_step(kinds)
    _add_quality(kinds)

    peers = kinds.add_parser("peers", help="llama-server and radixlm flag sets side by side on the serve workloads")
    _add_side_by_side_args(peers, "--num-threads 2;--num-threads 2 --quantization int8",
                           "random@1:12,random@8:32,random@32:64,shared-prefix@32:32,multi-turn@32:64")
    spec = kinds.add_parser("spec", help="speculative decoding on and off, and llama-server, at concurrency 1 on an "
                                         "input-grounded workload and on random prompts (bench peers' table)")
    _add_side_by_side_args(spec, f"{SPEC_BASE};{SPEC_BASE} --speculative-config '{SPEC_CONFIG}'",
                           "grounded@1:4,random@1:8")
    _add_soak(kinds)
    _add_serve(kinds)


def _add_offline(kinds: Any) -> None:
    """`bench offline`: radixlm against HF generate with static batches."""
    from radixlm.engine_args import add_engine_args

    offline = kinds.add_parser("offline", help="random workload: radixlm vs HF generate with static batches")
    offline.add_argument("--num-prompts", type=int, default=64)
    offline.add_argument("--input-len", default="64-512", help="prompt length range LOW-HIGH")
    offline.add_argument("--output-len", default="64-128", help="output length range LOW-HIGH")
    offline.add_argument("--hf-batch-sizes", default="8,16,32", help="comma-separated; empty skips HF")
    offline.add_argument("--workload-seed", type=int, default=0)
    offline.add_argument("--output-json", type=Path, default=None)
    offline.add_argument("--compare-data-parallel", action="store_true",
                         help="run one engine with --num-threads (default 2) threads, then --data-parallel-size 2 "
                              "with half the threads per replica, on the same requests")
    offline.add_argument("--compare-tensor-parallel", action="store_true",
                         help="run one engine with --num-threads (default 2) threads, then --tensor-parallel-size 2 "
                              "with half the threads per rank, on the same requests (with --compare-data-parallel: "
                              "all three side by side)")
    add_engine_args(offline)
    offline.set_defaults(handler=_cmd_offline)

def _add_step(kinds: Any) -> None:
    """`bench step`: one decode step broken down."""
    from radixlm.engine_args import add_engine_args

    step = kinds.add_parser("step", help="decode-step breakdown (attention, linears, other, sampler, scheduler) "
                                         "next to the memory bounds")
    step.add_argument("--batch-sizes", default="1,8,32,64",
                      help="comma-separated decode batch sizes (empty: no decode rows)")
    step.add_argument("--prefill-lens", default="2000",
                      help="comma-separated prompt lengths whose one-chunk prefill is broken down (empty: none)")
    step.add_argument("--context-lens", default="256,1024", help="comma-separated context lengths in tokens")
    step.add_argument("--prefix", choices=("none", "shared", "both"), default="both",
                      help="contexts without a shared prefix, with one (all but the last 32 tokens), or both")
    step.add_argument("--num-steps", type=int, default=5, help="measured decode steps per setting")
    step.add_argument("--quick", action="store_true", help="batch 1 and 8, context 256, 3 steps; a 256-token prefill")
    step.add_argument("--workload-seed", type=int, default=0)
    add_engine_args(step)
    step.set_defaults(handler=_cmd_step)

def _add_quality(kinds: Any) -> None:
    """`bench quality`: an engine setting against the float32 engine."""
    from radixlm.engine_args import add_engine_args

    quality = kinds.add_parser("quality", help="greedy agreement and text log-likelihood of the engine flags given "
                                               "against the float32 engine")
    quality.add_argument("--num-prompts", type=int, default=32, help="chat prompts for greedy agreement")
    quality.add_argument("--num-tokens", type=int, default=64, help="greedy tokens compared per prompt")
    quality.add_argument("--window", type=int, default=512, help="tokens per scoring window of the shipped text")
    quality.add_argument("--reference-model", default=None,
                         help="the float32 reference's model (default: --model), e.g. the default model against "
                              "its requantized GGUFs; it must share the tokenizer")
    quality.add_argument("--reference-kv-cache-dtype", default=None,
                         help="the reference's --kv-cache-dtype (default: the model dtype), e.g. int8 against "
                              "bfloat16")
    add_engine_args(quality)
    quality.set_defaults(handler=_cmd_quality)

def _add_soak(kinds: Any) -> None:
    """`bench soak`: hostile and ordinary requests; PASS if nothing broke."""
    from radixlm.engine_args import add_engine_args

    soak = kinds.add_parser("soak", help="hostile and ordinary requests at high concurrency; PASS if nothing broke")
    soak.add_argument("--base-url", default=None, help="a running server (default: start one with the engine flags)")
    soak.add_argument("--num-requests", type=int, default=1000)
    soak.add_argument("--concurrency", type=int, default=64)
    soak.add_argument("--workload-seed", type=int, default=0)
    soak.add_argument("--hostile", action="store_true",
                      help="after the mix, an attack phase (huge distinct grammars, request smuggling, huge tool "
                           "texts) timed by a trickle of tiny requests; PASS also needs their p99 < 1 s")
    soak.add_argument("--lora", dest="lora_churn", action="store_true",
                      help="two random adapters loaded at start, a fifth of the requests on them, a third adapter "
                           "loaded, used and unloaded over and over meanwhile; PASS also needs their answers unchanged")
    soak.add_argument("--hostile-requests", type=int, default=4, help="--hostile: attacks of each of the 5 kinds")
    soak.add_argument("--hostile-concurrency", type=int, default=4, help="--hostile: attacks in flight at once")
    soak.add_argument("--tiny-interval", type=float, default=0.075,
                      help="--hostile: seconds between two tiny requests (each on a fresh connection)")
    add_engine_args(soak)
    soak.set_defaults(handler=_cmd_soak)

def _add_serve(kinds: Any) -> None:
    """`bench serve`: an OpenAI client's view of a server (`--restart`: twice, over a restart)."""
    from radixlm.engine_args import add_engine_args

    serve = kinds.add_parser("serve", help="async OpenAI client against radixlm serve: TTFT, ITL, e2e, throughput")
    serve.add_argument("--base-url", default=None, help="a running server (default: start one with the engine flags)")
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--workloads", default="random,shared-prefix,multi-turn", help="comma-separated")
    serve.add_argument("--lora", type=int, default=0, help="N > 0: run each workload on the base model, then with its "
                       "sessions spread over N random-weight LoRA adapters (lora0..; made and loaded when the bench "
                       "starts the server), and print the ratio of output tok/s")
    serve.add_argument("--lora-rank", type=int, default=16, help="rank of the --lora adapters")
    serve.add_argument("--restart", action="store_true",
                       help="run the workloads, stop the server (SIGTERM: it saves its cached prefixes to "
                            "--kv-offload-dir, default a fresh temporary directory), start it again and rerun them")
    serve.add_argument("--num-prompts", type=int, default=32, help="requests per workload")
    serve.add_argument("--input-len", default="64-256", help="random prompts and first chat turns: LOW-HIGH tokens")
    serve.add_argument("--output-len", default="32-64", help="output length range LOW-HIGH")
    serve.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: tokens shared by 8 questions")
    serve.add_argument("--num-users", type=int, default=None,
                       help="multi-turn: conversations (default: --num-prompts / --num-rounds)")
    serve.add_argument("--num-rounds", type=int, default=4, help="multi-turn: turns per conversation")
    serve.add_argument("--request-rate", type=float, default=float("inf"), help="sessions per second (Poisson)")
    serve.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    serve.add_argument("--workload-seed", type=int, default=0)
    serve.add_argument("--output-json", default="bench-results/serve.json")
    serve.add_argument("--output-png", default="bench-results/serve.png")
    add_engine_args(serve)
    serve.set_defaults(handler=_cmd_serve)
