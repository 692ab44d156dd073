"""`radixlm bench soak`: many hostile and ordinary requests at high concurrency; the server must come out as it
went in.

It starts `radixlm serve` (or uses `--base-url`), asks fixed greedy probes, warms up with every kind of request,
then sends the mix of `soak_requests` (streaming, n > 1, grammars, stops, logprobs, clients that disconnect at
random, malformed bodies). At the end it checks: no crash (the process alive, `/health` 200), no 5xx, no dropped
connection the client did not drop itself, nothing running or waiting, no KV block held (leaked), the same greedy
answers, and the server's RSS within 1.1x of its RSS after the warm-up. One PASS/FAIL line sums it up.

`--hostile` adds an attack phase after the mix (`soak_attack`, `soak_hostile`): huge distinct grammars, request
smuggling on raw sockets, huge tool texts, while tiny requests time the delay other clients see. PASS then also
needs the tiny requests' p99 under 1 s, no smuggled answer, and the RSS within 1.1x of (the RSS after the warm-up +
the grammar cache budget that /metrics reports). Under data parallelism every gauge is summed over the replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from radixlm.bench.random_adapters import write_random_adapters
from radixlm.bench.serve import engine_flags, own_server
from radixlm.bench.serve_report import percentile
from radixlm.bench.soak_attack import HostileOptions, HostileTally, run_attacks, warm_up_attacks
from radixlm.bench.soak_hostile import build_attacks
from radixlm.bench.soak_lora import CHURN, RESIDENT, LoRASoak, adapter_probes, churn, lora_passed, with_adapters
from radixlm.bench.soak_requests import SoakRequest, build_requests, greedy_probes
from radixlm.bench.soak_verdict import GRAMMAR_BUDGET, GRAMMAR_BYTES, hostile_passed, print_hostile, rss_limit

STATE_METRICS = ("radixlm:num_requests_running", "radixlm:num_requests_waiting", "radixlm:kv_cache_used_blocks",
                 "radixlm:kv_host_leaked_blocks", "radixlm:kv_disk_leaked_files",
                 "process_resident_memory_bytes", GRAMMAR_BYTES, GRAMMAR_BUDGET)


@dataclass
class SoakTally:
    num_sent: int = 0
    num_2xx: int = 0
    num_4xx: int = 0
    num_5xx: int = 0
    num_disconnected: int = 0  # by the client, on purpose
    num_dropped: int = 0  # connections the server dropped or refused
    num_wrong: int = 0  # a valid body refused or a malformed one accepted
    latencies: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        if len(self.problems) < 10:
            self.problems.append(problem)


async def send(http: httpx.AsyncClient, request: SoakRequest, tally: SoakTally) -> str | None:
    """Send one request; returns the answer's text for greedy probes."""
    tally.num_sent += 1
    started = time.perf_counter()
    headers = {"Content-Type": "application/json"}
    try:
        async with asyncio.timeout(request.disconnect_after), \
                http.stream("POST", request.route, content=request.body.encode("utf-8", "surrogatepass"),
                            headers=headers) as response:
            body = b"".join([chunk async for chunk in response.aiter_bytes()])
    except TimeoutError:
        tally.num_disconnected += 1
        return None
    except httpx.TransportError as error:
        tally.num_dropped += 1
        tally.note(f"{request.route}: {type(error).__name__}: {error}")
        return None
    tally.latencies.append(time.perf_counter() - started)
    status = response.status_code
    if status >= 500:
        tally.num_5xx += 1
        tally.note(f"{status} for {request.body[:120]}: {body[:200]!r}")
    elif status >= 400:
        tally.num_4xx += 1
        if not request.malformed:
            tally.num_wrong += 1
            tally.note(f"{status} for a valid body {request.body[:120]}: {body[:200]!r}")
    else:
        tally.num_2xx += 1
        if request.malformed and '"n": 100000' not in request.body:
            tally.num_wrong += 1
            tally.note(f"{status} for a malformed body {request.body[:120]}")
    if request.greedy_probe and status == 200:
        return json.loads(body)["choices"][0]["message"]["content"]
    return None


async def run_mix(http: httpx.AsyncClient, requests: list[SoakRequest], concurrency: int, tally: SoakTally) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(request: SoakRequest) -> None:
        async with limit:
            await send(http, request, tally)

    await asyncio.gather(*(one(r) for r in requests))


def parse_state(text: str) -> dict[str, float]:
    """The STATE_METRICS found in a Prometheus exposition, each summed over its samples: data parallelism shows
    every replica's gauges apart (a `replica` label), and a leak or a request left running in any of them counts.
    A metric the server does not expose is absent."""
    state: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in STATE_METRICS:
            state[name] = state.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return state


async def server_state(http: httpx.AsyncClient) -> dict[str, float]:
    """The metrics the verdict needs (gauges of the engine, the process's RSS), summed over replicas."""
    return parse_state((await http.get("/metrics")).text)


async def settle(http: httpx.AsyncClient, timeout: float = 120.0) -> dict[str, float]:
    """Wait until nothing runs or waits (aborted requests end within a step); returns the final state."""
    deadline = time.monotonic() + timeout
    while True:
        state = await server_state(http)
        idle = state.get("radixlm:num_requests_running") == 0 and state.get("radixlm:num_requests_waiting") == 0
        if idle or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.2)


async def soak(base_url: str, num_requests: int, concurrency: int, seed: int,
               hostile: HostileOptions | None = None, lora: LoRASoak | None = None) -> bool:
    async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                 limits=httpx.Limits(max_connections=concurrency + 8)) as http:
        tally = SoakTally()
        probes = greedy_probes() + (adapter_probes() if lora is not None else [])
        before = [await send(http, probe, tally) for probe in probes]
        await run_mix(http, build_requests(max(20, num_requests // 10), seed + 1), concurrency, SoakTally())
        if hostile is not None:
            await run_attacks(base_url, warm_up_attacks(seed + 1), hostile, HostileTally())
        warm = await settle(http)
        started = time.perf_counter()
        mix = build_requests(num_requests, seed)
        if lora is None:
            await run_mix(http, mix, concurrency, tally)
        else:
            mix_done = asyncio.Event()
            churning = asyncio.create_task(churn(http, lora, mix_done))
            await run_mix(http, with_adapters(mix, seed), concurrency, tally)
            mix_done.set()
            await churning
        seconds = time.perf_counter() - started
        hostile_tally, hostile_seconds = HostileTally(), 0.0
        mixed: dict[str, float] = {}
        if hostile is not None:
            attacks = await asyncio.to_thread(build_attacks, hostile.num_each, seed)  # before the clock starts
            mixed = await settle(http)  # the attacks' delays, not the mix's tail, are what the tiny requests time
            hostile_seconds = await run_attacks(base_url, attacks, hostile, hostile_tally)
        final = await settle(http)
        after = [await send(http, probe, tally) for probe in probes]
        healthy = (await http.get("/health")).status_code == 200
    passed = report(tally, seconds, warm, final, before, after, healthy, hostile is not None,
                    print_verdict=hostile is None and lora is None)
    if lora is not None:
        passed = lora_passed(lora, before, after) and passed
        print(f"{'PASS' if passed else 'FAIL'} (with --lora)")
    if hostile is None:
        return passed
    print_hostile(hostile_tally, hostile_seconds, mixed, final)
    passed = hostile_passed(hostile_tally) and passed
    print("PASS (with --hostile)" if passed else "FAIL (with --hostile)")
    return passed


def report(tally: SoakTally, seconds: float, warm: dict[str, float], final: dict[str, float],
           before: list[str | None], after: list[str | None], healthy: bool, hostile: bool = False,
           print_verdict: bool = True) -> bool:
    """Print the mix's lines and the end state; True if they pass. `hostile`: the RSS limit allows for the grammar
    cache budget (`rss_limit`). `print_verdict` False: the PASS/FAIL line is left to the caller, who adds the
    verdict of its other phases (attacks, adapters)."""
    rss_warm = warm.get("process_resident_memory_bytes", 0.0)
    rss_final = final.get("process_resident_memory_bytes", 0.0)
    limit, rule = rss_limit(warm, final, hostile)
    leaked = int(final.get("radixlm:kv_cache_used_blocks", -1))
    leaked_tiers = int(final.get("radixlm:kv_host_leaked_blocks", 0) + final.get("radixlm:kv_disk_leaked_files", 0))
    running = int(final.get("radixlm:num_requests_running", -1))
    waiting = int(final.get("radixlm:num_requests_waiting", -1))
    crashes = int(not healthy)
    same_greedy = before == after and None not in before
    print(f"requests: {tally.num_sent} in {seconds:.1f} s ({tally.num_2xx} 2xx, {tally.num_4xx} 4xx, "
          f"{tally.num_5xx} 5xx, {tally.num_disconnected} disconnected by the client, {tally.num_dropped} dropped "
          f"by the server, {tally.num_wrong} wrong status)")
    if tally.latencies:
        print(f"latency of answered requests: p50 {statistics.median(tally.latencies):.2f} s, "
              f"p99 {percentile(tally.latencies, 99):.2f} s")
    tiers = ""
    if "radixlm:kv_host_leaked_blocks" in final:
        tiers = (f" (host tier {int(final['radixlm:kv_host_leaked_blocks'])}, disk files "
                 f"{int(final.get('radixlm:kv_disk_leaked_files', 0))})")
    print(f"crashes: {crashes}; leaked blocks: {leaked}{tiers}; running/waiting at the end: {running}/{waiting}")
    print(f"RSS: {rss_warm / 2**20:.0f} MiB after warm-up, {rss_final / 2**20:.0f} MiB at the end "
          f"({rss_final / max(rss_warm, 1):.3f}x); limit {limit / 2**20:.0f} MiB: {rule}")
    print(f"greedy answers before and after: {'unchanged' if same_greedy else 'CHANGED'}")
    for problem in tally.problems:
        print(f"  problem: {problem}")
    passed = (crashes == 0 and tally.num_5xx == 0 and tally.num_dropped == 0 and tally.num_wrong == 0
              and leaked == 0 and leaked_tiers == 0 and running == 0 and waiting == 0 and same_greedy
              and rss_final <= limit)
    if print_verdict:
        print("PASS" if passed else "FAIL")
    return passed


def bench_soak(base_url: str | None, engine_options: dict[str, Any], num_requests: int, concurrency: int,
               seed: int, hostile: HostileOptions | None = None, lora: bool = False) -> bool:
    """Run the soak against `base_url`, or against a server started with `engine_options`; True if it passed.
    `hostile` adds the attack phase (`--hostile`); `lora` the adapters' churn (`--lora`: the bench starts the
    server with its adapters, so not with `base_url`)."""
    if base_url is not None:
        if lora:
            raise ValueError("--lora starts its own server with its adapters: drop --base-url")
        return asyncio.run(soak(base_url, num_requests, concurrency, seed, hostile))
    with contextlib.ExitStack() as stack:
        flags, state = engine_flags(engine_options), None
        if lora:
            state = LoRASoak({})
            flags += _lora_flags(engine_options, Path(stack.enter_context(tempfile.TemporaryDirectory())), state)
        url, process = stack.enter_context(own_server(flags))
        passed = asyncio.run(soak(url, num_requests, concurrency, seed, hostile, state))
        if process.poll() is not None:
            print(f"FAIL: the server exited with {process.returncode}")
            return False
    return passed


def _lora_flags(engine_options: dict[str, Any], scratch: Path, state: LoRASoak) -> list[str]:
    """Write the soak's adapters (two resident, one churned) for the served model; the flags that load them."""
    from radixlm.config import DEFAULT_MODEL
    from radixlm.model.loader import resolve_model_dir

    model_dir = resolve_model_dir(str(engine_options.get("model", DEFAULT_MODEL)))
    written = write_random_adapters(model_dir, scratch, len(RESIDENT) + 1, rank=8)
    names = [*RESIDENT, CHURN]
    state.paths.update({name: path for name, (_, path) in zip(names, written, strict=True)})
    return ["--lora-modules", *[f"{name}={state.paths[name]}" for name in RESIDENT], "--max-loras", "3"]
