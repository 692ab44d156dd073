"""`radixlm bench peers`: the issue-15 table, side by side in one run: llama.cpp's `llama-server` (the CPU peer in
`../shared/peers/`) and `radixlm serve` under one or more flag sets, one server at a time (two servers on 2 cores
would measure nothing), the same `bench serve` workloads against each.

Cases are `WORKLOAD@CONCURRENCY:REQUESTS`; every request is greedy with `ignore_eos`, so each server does the same
work. It prints output tok/s and ITL p50 per server and case, and each radixlm set's ratio to the peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from radixlm.bench.serve import BenchOptions, own_server, run_all, wait_healthy
from radixlm.bench.serve_workloads import WorkloadSpec
from radixlm.bench.workload import parse_range
from radixlm.model.loader import load_tokenizer, resolve_model_dir

MAX_CONCURRENCY = 4096  # clients of one case
MAX_REQUESTS = 100_000  # requests of one case


@dataclass(frozen=True)
class Case:
    workload: str
    concurrency: int
    num_requests: int

    @classmethod
    def parse(cls, text: str) -> Case:
        try:
            workload, rest = text.split("@")
            concurrency, num_requests = rest.split(":")
            case = cls(workload, int(concurrency), int(num_requests))
        except ValueError:
            raise ValueError(f"a case is WORKLOAD@CONCURRENCY:REQUESTS, got {text!r}") from None
        if not 1 <= case.concurrency <= MAX_CONCURRENCY or not 1 <= case.num_requests <= MAX_REQUESTS:
            raise ValueError(f"a case's concurrency must be in [1, {MAX_CONCURRENCY}] and its requests in "
                             f"[1, {MAX_REQUESTS}], got {text!r}")
        return case

    @property
    def name(self) -> str:
        return f"{self.workload}, c={self.concurrency}"

    def spec(self, seed: int, input_len: str = "64-256", output_len: str | None = None) -> WorkloadSpec:
        """The issues' workloads: random 64-256 tokens in / 64 out; shared-prefix 4 x 8 questions on a 1,000-token
        prefix, 32 out; multi-turn 4 rounds, 32-64 out; grounded: repeat a 300-token passage, 256 out.
        `input_len` / `output_len` ("LOW-HIGH") replace the random workload's."""
        default_output = {"random": "64-64", "shared-prefix": "32-32", "grounded": "256-256"}.get(self.workload,
                                                                                                 "32-64")
        if self.workload == "random" and output_len:
            default_output = output_len
        return WorkloadSpec(num_prompts=self.num_requests, input_len=parse_range(input_len),
                            output_len=parse_range(default_output), prefix_len=1000, seed=seed)


@contextlib.contextmanager
def peer_server(script: str, port: int, model: str | None = None, timeout: float = 900.0
                ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The peer started by `script` on `port`, on the GGUF file `model` (the script's default when None); yields its
    base URL and process (the script execs the server, so the process is the server's)."""
    env = dict(os.environ, **({"GGUF": str(Path(model).resolve())} if model else {}))
    process = subprocess.Popen(["bash", script, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, process, timeout, script)
        yield base_url, process
    finally:
        process.terminate()
        process.wait(60)


def measure(base_url: str, cases: list[Case], tokenizer: object, seed: int, lengths: tuple[str, str | None]
            ) -> dict[Case, dict[str, float]]:
    """Each case on the server at `base_url`, in order. Case i draws its prompts from seed + i: every server gets the
    same prompts for a case, and no case repeats an earlier one's (which a prefix cache would serve from memory)."""
    results = {}
    for index, case in enumerate(cases):
        options = BenchOptions([case.workload], case.spec(seed + index, *lengths), max_concurrency=case.concurrency)
        summary = asyncio.run(run_all(base_url, options, tokenizer))[0].summary()
        results[case] = summary
        print(f"  {case.name}: {summary['output_tok_per_s']:.1f} out tok/s, ITL p50 {summary['itl_p50'] * 1000:.0f} "
              f"ms, TTFT p50 {summary['ttft_p50'] * 1000:.0f} ms, failed {summary['failed']}", flush=True)
    return results


@dataclass(frozen=True)
class ServerCost:
    """What a server took: seconds from start to a healthy /health, and its peak resident memory (VmHWM) after the
    cases ran."""
    ready_seconds: float
    peak_rss_bytes: int


def process_peak_rss_bytes(pid: int) -> int:
    """One process's peak resident set size (Linux's VmHWM), 0 where /proc does not say."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes(pid: int) -> int:
    """A server's peak resident set size: its process's and every live descendant's, summed. A server may hold its
    model in child processes (vLLM's engine core and worker: 0.8 GB in its API process, 5.3 GB in its worker), and
    each one's peak is summed, an upper bound of the tree's peak when they came at different times."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        children = []
    return process_peak_rss_bytes(pid) + sum(process_peak_rss_bytes(child.pid) for child in children)


@contextlib.contextmanager
def timed_server(server: contextlib.AbstractContextManager, costs: dict[str, ServerCost], label: str
                 ) -> Iterator[str]:
    """`server` (yielding its URL and process) entered; its cost is put in `costs[label]` on the way out."""
    started = time.monotonic()
    with server as (url, process):
        ready = time.monotonic() - started
        yield url
        costs[label] = ServerCost(ready, peak_rss_bytes(process.pid))


def bench_peers(radixlm_sets: list[str], cases: list[Case], peer_script: str | None, port: int, seed: int,
                model: str | None = None, input_len: str = "64-256", output_len: str | None = None,
                peer_name: str = "llama-server") -> None:
    """`model`: a .gguf file the peer and every radixlm set (that names no --model of its own) serve;
    `input_len`, `output_len`: the random workload's lengths (see `Case.spec`); `peer_name`: the peer's column."""
    parse_range(input_len)
    if output_len:
        parse_range(output_len)
    if model is not None and not (model.endswith(".gguf") and Path(model).is_file()):
        raise ValueError(f"--model must be an existing .gguf file (the peer loads GGUF only), got {model!r}")
    tokenizer = load_tokenizer(resolve_model_dir(model or "SmolLM2-135M-Instruct"))
    columns: dict[str, dict[Case, dict[str, float]]] = {}
    costs: dict[str, ServerCost] = {}
    if peer_script:
        if not Path(peer_script).exists():
            raise FileNotFoundError(f"no peer start script at {peer_script}")
        print(f"{peer_name}{f' ({Path(model).name})' if model else ''}:", flush=True)
        with timed_server(peer_server(peer_script, port, model), costs, peer_name) as url:
            columns[peer_name] = measure(url, cases, tokenizer, seed, (input_len, output_len))
    for flags in radixlm_sets:
        label = f"radixlm {flags}".strip()
        print(f"{label}:", flush=True)
        argv = shlex.split(flags)
        if model is not None and "--model" not in argv:
            argv += ["--model", model]
        with timed_server(own_server(argv), costs, label) as url:
            columns[label] = measure(url, cases, tokenizer, seed, (input_len, output_len))
    print_table(columns, cases, peer_name if peer_script else None)
    print_costs(costs, peer_name if peer_script else None)


def print_table(columns: dict[str, dict[Case, dict[str, float]]], cases: list[Case],
                peer_name: str | None = None) -> None:
    labels = list(columns)
    own = [label for label in labels if label != peer_name]
    if len(own) > 1:  # each later radixlm set against the first one
        print("\n| case | " + " | ".join(f"{label} / {own[0]}" for label in own[1:]) + " |")
        print("|---" * len(own) + "|")
        for case in cases:
            base = columns[own[0]][case]["output_tok_per_s"]
            print(f"| {case.name} | " + " | ".join(f"{columns[label][case]['output_tok_per_s'] / base:.2f}x"
                                                  for label in own[1:]) + " |")
    peer = columns.get(peer_name) if peer_name else None
    header = " | ".join(f"{label} out tok/s (ITL p50 ms)" for label in labels)
    ratios = " | ".join(f"{label} / {peer_name}" for label in own) if peer else ""
    print(f"\n| case | {header} |" + (f" {ratios} |" if ratios else ""))
    print("|---" * (1 + len(labels) + (len(labels) - 1 if peer else 0)) + "|")
    for case in cases:
        cells = [f"{columns[label][case]['output_tok_per_s']:.1f} ({columns[label][case]['itl_p50'] * 1000:.0f})"
                 for label in labels]
        if peer:
            base = peer[case]["output_tok_per_s"]
            cells += [f"{columns[label][case]['output_tok_per_s'] / base:.2f}x" for label in own]
        print(f"| {case.name} | " + " | ".join(cells) + " |")


def print_costs(costs: dict[str, ServerCost], peer_name: str | None = None) -> None:
    peer = costs.get(peer_name) if peer_name else None
    print("\n| server | ready in s | peak RSS GB |" + (f" peak RSS / {peer_name}'s |" if peer else ""))
    print("|---|---|---|" + ("---|" if peer else ""))
    for label, cost in costs.items():
        ratio = f" {cost.peak_rss_bytes / max(1, peer.peak_rss_bytes):.2f}x |" if peer else ""
        print(f"| {label} | {cost.ready_seconds:.1f} | {cost.peak_rss_bytes / 1e9:.2f} |{ratio}")
