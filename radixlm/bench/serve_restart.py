"""`radixlm bench serve --restart`: the workloads on a server with a disk tier (`--kv-offload-dir`), then again on a
second server started on the same directory after the first one's clean shutdown (SIGTERM), which saved its cached
prefixes there. The second run's first request on a saved prefix loads it from disk instead of computing it; the
report puts each workload's two runs side by side (TTFT of the first request, and p50)."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from typing import Any

from radixlm.bench.serve import BenchOptions, engine_flags, own_server, run_all
from radixlm.bench.serve_report import WorkloadResult, print_table
from radixlm.model.loader import load_tokenizer, resolve_model_dir

RUNS = ("cold", "after restart")


def bench_serve_restart(engine_options: dict[str, Any], options: BenchOptions) -> list[WorkloadResult]:
    """`--kv-offload-dir` defaults to a fresh temporary directory (so that the first run is cold) and
    `--kv-offload-memory` to 1 GiB."""
    from radixlm.config import DEFAULT_MODEL

    tokenizer = load_tokenizer(resolve_model_dir(str(engine_options.get("model", DEFAULT_MODEL))))
    results: list[WorkloadResult] = []
    with tempfile.TemporaryDirectory(prefix="radixlm-kv-") as scratch:
        flags = engine_flags({"kv_offload_memory": "1GiB", "kv_offload_dir": scratch, **engine_options})
        for label in RUNS:
            with own_server(flags) as (url, _):
                for result in asyncio.run(run_all(url, options, tokenizer)):
                    results.append(WorkloadResult(f"{result.name} ({label})", result.records, result.seconds))
    print_table(results, options)
    half = len(results) // 2
    for cold, warm in zip(results[:half], results[half:], strict=True):
        print_ratio(cold, warm)
    return results


def _first_ttft(result: WorkloadResult) -> float | None:
    started = sorted((r for r in result.ok if r.ttft is not None), key=lambda r: r.start)
    return started[0].ttft if started else None


def print_ratio(cold: WorkloadResult, warm: WorkloadResult) -> None:
    """The first request's TTFT and the TTFT p50 after the restart, against the cold run's."""
    name = cold.name.rpartition(" (")[0]
    firsts = _first_ttft(cold), _first_ttft(warm)
    if firsts[0] and firsts[1] is not None:
        print(f"{name}: first request TTFT {firsts[1] * 1e3:.0f} ms after the restart against {firsts[0] * 1e3:.0f} "
              f"ms cold: {firsts[1] / firsts[0]:.2f}x")
    p50s = [statistics.median([r.ttft for r in result.ok if r.ttft is not None] or [float("nan")])
            for result in (cold, warm)]
    print(f"{name}: TTFT p50 {p50s[1] * 1e3:.0f} ms after the restart against {p50s[0] * 1e3:.0f} ms cold: "
          f"{p50s[1] / p50s[0]:.2f}x")
