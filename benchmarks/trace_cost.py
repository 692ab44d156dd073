"""What `--trace` costs. The same random workload through one engine without a trace and
one with it, each warmed up by one uncounted run, then alternating (off, on, off, on, ...) so that drift on a shared
machine hits both; prints each run and the overhead of tracing on output throughput (the goal: at most 2%).

    .venv/bin/python benchmarks/trace_cost.py [--num-prompts 32] [--repeats 5] [engine flags]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from radixlm.bench.offline import run_radixlm
from radixlm.bench.workload import parse_range, random_requests
from radixlm.engine_args import add_engine_args, engine_kwargs
from radixlm.llm import LLM


def bench_trace(engine_options: dict, num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                repeats: int, seed: int) -> float:
    """Returns the overhead of tracing as a fraction of the untraced throughput (median of the runs)."""
    with tempfile.TemporaryDirectory() as folder:
        trace_path = Path(folder) / "trace.jsonl"
        engines = {"off": LLM(**engine_options), "on": LLM(**engine_options, trace=str(trace_path))}
        requests = random_requests(engines["off"].tokenizer, num_prompts, input_len, output_len, seed)
        throughput: dict[str, list[float]] = {"off": [], "on": []}
        for llm in engines.values():  # first runs pay one-time costs (page faults, allocator growth): not counted
            run_radixlm(llm, requests)
        for repeat in range(repeats):
            for name in ("off", "on"):
                result = run_radixlm(engines[name], requests)
                throughput[name].append(result.output_tok_s)
                print(f"run {repeat + 1}, trace {name}: {result.output_tok_s:.1f} output tok/s", flush=True)
        trace_bytes = trace_path.stat().st_size
    off, on = statistics.median(throughput["off"]), statistics.median(throughput["on"])
    overhead = 1 - on / off
    print(f"\n{num_prompts} prompts x {repeats} runs each: trace off {off:.1f}, on {on:.1f} output tok/s (medians); "
          f"tracing costs {100 * overhead:.2f}% of throughput ({trace_bytes / 2**20:.1f} MiB of trace)")
    return overhead


def main(argv: list[str] | None = None) -> None:
    """Parse the flags (`argv`, default the command line) and run the benchmark; `--trace` is ignored, since the
    benchmark runs with tracing both off and on."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", default="64-256", help="prompt length range LOW-HIGH")
    parser.add_argument("--output-len", default="32-64", help="output length range LOW-HIGH")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workload-seed", type=int, default=0)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    options = engine_kwargs(args)
    options.pop("trace", None)  # the bench runs both settings
    bench_trace(options, args.num_prompts, parse_range(args.input_len), parse_range(args.output_len), args.repeats,
                args.workload_seed)


if __name__ == "__main__":
    main()
