"""The rules `radixlm bench soak` judges by: the RSS limit (with `--hostile`, the grammar cache's budget on top),
and what the attack phase must show (tiny requests fast, no 5xx, no drop, nothing smuggled)."""

from __future__ import annotations

import math
import statistics

from radixlm.bench.serve_report import percentile
from radixlm.bench.soak_attack import HostileTally
from radixlm.bench.soak_hostile import ATTACK_KINDS

RSS_GROWTH_LIMIT = 1.1
TINY_P99_LIMIT = 1.0  # seconds
GRAMMAR_BYTES = "radixlm:grammar_cache_bytes"
GRAMMAR_BUDGET = "radixlm:grammar_cache_budget_bytes"


def rss_limit(warm: dict[str, float], final: dict[str, float], hostile: bool) -> tuple[float, str]:
    """The most RSS the server may hold at the end, and how it was reached. Plain soak: 1.1x its RSS after the
    warm-up. Hostile: 1.1x (that RSS + the grammar cache budget from /metrics), since the attacks are meant to fill
    the cache up to its budget; without the gauge (a server that does not bound its cache yet), the plain rule."""
    rss_warm = warm.get("process_resident_memory_bytes", 0.0)
    if not hostile:
        return RSS_GROWTH_LIMIT * rss_warm, f"{RSS_GROWTH_LIMIT}x the RSS after warm-up"
    budget = final.get(GRAMMAR_BUDGET, warm.get(GRAMMAR_BUDGET))
    if budget is None:
        return (RSS_GROWTH_LIMIT * rss_warm, f"{RSS_GROWTH_LIMIT}x the RSS after warm-up: no {GRAMMAR_BUDGET} on "
                                              "/metrics (the server does not report a bounded grammar cache)")
    return (RSS_GROWTH_LIMIT * (rss_warm + budget),
            f"{RSS_GROWTH_LIMIT}x (RSS after warm-up + grammar cache budget {budget / 2**20:.0f} MiB)")


def tiny_p99(tally: HostileTally) -> float:
    """p99 of the tiny requests' latency; inf when none was answered (a server that answered none is not fast)."""
    return percentile(tally.tiny_latencies, 99) if tally.tiny_latencies else math.inf


def hostile_passed(tally: HostileTally) -> bool:
    """The attack phase's part of PASS: tiny requests' p99 under TINY_P99_LIMIT, no 5xx, no dropped connection,
    no status a kind does not allow, no framing outcome but a refusal, and no smuggled answer."""
    return (tiny_p99(tally) < TINY_P99_LIMIT and tally.num_5xx == 0 and tally.num_dropped == 0
            and tally.num_unexpected == 0 and tally.num_smuggled == 0)


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{key}: {value}" for key, value in sorted(counter.items())) or "none"


def print_hostile(tally: HostileTally, seconds: float, before: dict[str, float], final: dict[str, float]) -> None:
    """The attack phase's lines of the report; `before` and `final` are the server's state before and after it."""
    num_attacks = sum(sum(tally.statuses.get(kind, {}).values()) for kind in ATTACK_KINDS)
    print(f"hostile: {num_attacks} answers to attacks in {seconds:.1f} s")
    for kind in ATTACK_KINDS:
        latencies = tally.latencies.get(kind, [])
        timing = (f"; latency p50 {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s"
                  if latencies else "")
        print(f"  {kind}: {_counts(tally.statuses.get(kind, {}))}{timing}")
    print(f"  framing outcomes: {_counts(tally.framing_outcomes)}")
    tiny = tally.tiny_latencies
    if tiny:
        print(f"tiny requests during the attacks: {len(tiny)} ({_counts(tally.statuses.get('tiny', {}))}); latency "
              f"p50 {statistics.median(tiny):.3f} s, p99 {tiny_p99(tally):.3f} s, max {max(tiny):.3f} s "
              f"(limit: p99 < {TINY_P99_LIMIT:.0f} s)")
        for route, latencies in sorted(tally.tiny_route_latencies.items()):
            print(f"  {route}: {len(latencies)}; p50 {statistics.median(latencies):.3f} s, "
                  f"p99 {percentile(latencies, 99):.3f} s, max {max(latencies):.3f} s")
    else:
        print("tiny requests during the attacks: none answered")
    print(f"hostile problems: {tally.num_5xx} 5xx, {tally.num_dropped} dropped, {tally.num_unexpected} unexpected, "
          f"{tally.num_smuggled} smuggled answers")
    if GRAMMAR_BYTES in final or GRAMMAR_BUDGET in final:
        print(f"grammar cache: {final.get(GRAMMAR_BYTES, math.nan) / 2**20:.0f} MiB held of a "
              f"{final.get(GRAMMAR_BUDGET, math.nan) / 2**20:.0f} MiB budget")
    else:
        print(f"grammar cache: {GRAMMAR_BYTES} / {GRAMMAR_BUDGET} missing from /metrics (server side not ready?)")
    rss = "process_resident_memory_bytes"
    if rss in before and rss in final:  # tells the attacks' growth from the mix's
        print(f"RSS around the attacks: {before[rss] / 2**20:.0f} MiB before (grammar cache "
              f"{before.get(GRAMMAR_BYTES, math.nan) / 2**20:.0f} MiB), {final[rss] / 2**20:.0f} MiB after")
    for problem in tally.problems:
        print(f"  problem: {problem}")
