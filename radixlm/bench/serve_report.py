"""Results of `radixlm bench serve`: per-request records, percentile summaries, a table, JSON and a PNG plot."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request; times in seconds (`start` from the beginning of its workload)."""

    session: int
    turn: int
    start: float
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * p / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class WorkloadResult:
    name: str
    records: list[RequestRecord]
    seconds: float

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is None]

    def summary(self) -> dict[str, Any]:
        ok = self.ok
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        itls = [gap for r in ok for gap in r.itls]
        e2es = [r.e2e for r in ok if r.e2e is not None]
        prompt_tokens = sum(r.prompt_tokens for r in ok)
        output_tokens = sum(r.output_tokens for r in ok)
        result: dict[str, Any] = {
            "requests": len(self.records), "failed": len(self.records) - len(ok), "seconds": self.seconds,
            "request_per_s": len(ok) / self.seconds, "output_tok_per_s": output_tokens / self.seconds,
            "total_tok_per_s": (prompt_tokens + output_tokens) / self.seconds, "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "cached_fraction": sum(r.cached_tokens for r in ok) / prompt_tokens if prompt_tokens else 0.0,
        }
        for name, values in (("ttft", ttfts), ("itl", itls), ("e2e", e2es)):
            result[f"{name}_mean"] = statistics.fmean(values) if values else math.nan
            for p in PERCENTILES:
                result[f"{name}_p{p}"] = percentile(values, p)
        return result


def by_round(result: WorkloadResult) -> list[dict[str, Any]]:
    """Per turn index (round): requests, TTFT mean and percentiles, and the fraction of prompt tokens cached."""
    rounds = []
    for turn in sorted({r.turn for r in result.records}):
        ok = [r for r in result.ok if r.turn == turn]
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        prompt_tokens = sum(r.prompt_tokens for r in ok)
        row: dict[str, Any] = {"round": turn + 1, "requests": sum(r.turn == turn for r in result.records),
                               "failed": sum(r.turn == turn for r in result.records) - len(ok),
                               "ttft_mean": statistics.fmean(ttfts) if ttfts else math.nan,
                               "cached_fraction": sum(r.cached_tokens for r in ok) / prompt_tokens
                               if prompt_tokens else 0.0}
        for p in PERCENTILES:
            row[f"ttft_p{p}"] = percentile(ttfts, p)
        rounds.append(row)
    return rounds


def print_rounds(results: list[WorkloadResult]) -> None:
    """TTFT by round for the workloads whose sessions have more than one turn."""
    for result in results:
        rounds = by_round(result)
        if len(rounds) < 2:
            continue
        print(f"\n{result.name}: TTFT by round, ms (p50 / p90 / p99)")
        print("| round | requests (failed) | cached | TTFT mean | TTFT |\n|---|---|---|---|---|")
        for row in rounds:
            ttft = " / ".join(_ms(row[f"ttft_p{p}"]) for p in PERCENTILES)
            print(f"| {row['round']} | {row['requests']} ({row['failed']}) | {row['cached_fraction']:.0%} "
                  f"| {_ms(row['ttft_mean'])} | {ttft} |")


def _ms(value: float) -> str:
    return f"{value * 1000:.0f}"


def print_table(results: list[WorkloadResult], options: Any) -> None:
    rate = "inf" if options.request_rate == float("inf") else f"{options.request_rate:g}"
    print(f"\nrequest rate {rate}/s, max concurrency {options.max_concurrency or 'unlimited'}, greedy, ignore_eos; "
          f"TTFT / ITL in ms, e2e in s (p50 / p90 / p99)")
    print("| workload | requests (failed) | seconds | req/s | output tok/s | total tok/s | cached | TTFT | ITL | e2e |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        s = result.summary()
        ttft = " / ".join(_ms(s[f"ttft_p{p}"]) for p in PERCENTILES)
        itl = " / ".join(_ms(s[f"itl_p{p}"]) for p in PERCENTILES)
        e2e = " / ".join(f"{s[f'e2e_p{p}']:.1f}" for p in PERCENTILES)
        print(f"| {result.name} | {s['requests']} ({s['failed']}) | {s['seconds']:.1f} | {s['request_per_s']:.2f} "
              f"| {s['output_tok_per_s']:.1f} | {s['total_tok_per_s']:.1f} | {s['cached_fraction']:.0%} | {ttft} "
              f"| {itl} | {e2e} |")
    print_rounds(results)
    for result in results:
        for record in result.records:
            if record.error:
                print(f"{result.name}: first failure: {record.error}")
                break


def save_json(results: list[WorkloadResult], options: Any, path: str | Path) -> None:
    data = {"options": {"workloads": options.workloads, "spec": asdict(options.spec),
                        "request_rate": str(options.request_rate), "max_concurrency": options.max_concurrency},
            "results": {r.name: {"summary": r.summary(), "by_round": by_round(r),
                                 "requests": [asdict(x) for x in r.records]}
                        for r in results}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, allow_nan=True))
    print(f"wrote {path}")


def save_plot(results: list[WorkloadResult], path: str | Path) -> None:
    """CDFs of TTFT, ITL and e2e latency, one line per workload."""
    import matplotlib  # a dev dependency, only for this plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for axis, (title, unit, scale) in zip(axes, (("TTFT", "ms", 1000), ("inter-token latency", "ms", 1000),
                                                 ("end-to-end latency", "s", 1)), strict=True):
        for result in results:
            if title == "TTFT":
                values = [r.ttft for r in result.ok if r.ttft is not None]
            elif title == "end-to-end latency":
                values = [r.e2e for r in result.ok if r.e2e is not None]
            else:
                values = [gap for r in result.ok for gap in r.itls]
            ordered = sorted(v * scale for v in values)
            axis.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=result.name)
        axis.set(title=title, xlabel=unit, ylabel="fraction of requests" if title != "inter-token latency"
                 else "fraction of gaps")
        if title == "inter-token latency":
            axis.set_xscale("log")  # most gaps are one decode step; the tail (prefill stalls) is decades longer
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("radixlm bench serve")
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"wrote {path}")
