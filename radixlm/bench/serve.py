"""`radixlm bench serve`: an async OpenAI client driving a running `radixlm serve` (or one it starts itself).

Sessions (see serve_workloads) arrive as a Poisson process at `--request-rate` (inf: all at once); at most
`--max-concurrency` requests are in flight. Every request streams greedy, `ignore_eos` output with usage, so each
run does the same work; TTFT is the time to the first token chunk, ITL the gaps between token chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from radixlm.bench.random_adapters import write_random_adapters
from radixlm.bench.serve_report import RequestRecord, WorkloadResult, print_table, save_json, save_plot
from radixlm.bench.serve_workloads import Session, WorkloadSpec, build_sessions
from radixlm.model.loader import load_tokenizer, resolve_model_dir


@dataclass
class BenchOptions:
    workloads: list[str]
    spec: WorkloadSpec
    request_rate: float = float("inf")
    max_concurrency: int | None = None
    output_json: str | None = None
    output_png: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    num_loras: int = 0  # > 0: each workload runs on the base model, then with requests spread over this many adapters
    lora_rank: int = 16


async def _one_request(client: Any, model: str, session: Session, messages: list[dict[str, str]],
                       turn: list[int] | str, output_len: int, record: RequestRecord) -> str:
    """Stream one request into `record`; returns the generated text (the next turn's history needs it)."""
    kwargs = dict(model=model, max_tokens=output_len, temperature=0, stream=True,
                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    start = time.perf_counter()
    if session.chat:
        stream = await client.chat.completions.create(messages=[*messages, {"role": "user", "content": turn}],
                                                      **kwargs)
    else:
        stream = await client.completions.create(prompt=turn, **kwargs)
    pieces, token_times = [], []
    async for chunk in stream:
        if chunk.usage is not None:
            record.prompt_tokens = chunk.usage.prompt_tokens
            record.output_tokens = chunk.usage.completion_tokens
            details = chunk.usage.prompt_tokens_details
            record.cached_tokens = details.cached_tokens if details else 0
        for choice in chunk.choices:
            if session.chat and choice.delta.role is not None:
                continue  # the role opens the stream at admission; it carries no token
            token_times.append(time.perf_counter())
            pieces.append((choice.delta.content if session.chat else choice.text) or "")
    end = time.perf_counter()
    record.ttft = token_times[0] - start if token_times else None
    record.itls = [b - a for a, b in itertools.pairwise(token_times)]
    record.e2e = end - start
    return "".join(pieces)


async def run_workload(client: Any, models: list[str], sessions: list[Session], request_rate: float,
                       max_concurrency: int | None, seed: int) -> tuple[list[RequestRecord], float]:
    """Run every session (session i asks for `models[i % len(models)]`); returns the per-request records and the
    wall time."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    rng = random.Random(seed)
    records: list[RequestRecord] = []
    bench_start = time.perf_counter()

    async def run_session(index: int, session: Session, delay: float) -> None:
        await asyncio.sleep(delay)
        messages: list[dict[str, str]] = []
        for turn_index, (turn, output_len) in enumerate(zip(session.turns, session.output_lens, strict=True)):
            record = RequestRecord(session=index, turn=turn_index, start=time.perf_counter() - bench_start)
            records.append(record)
            try:
                async with limit or contextlib.nullcontext():
                    answer = await _one_request(client, models[index % len(models)], session, messages, turn,
                                                output_len, record)
            except Exception as error:  # a failed request is reported, and ends its session
                record.error = f"{type(error).__name__}: {error}"
                return
            if session.chat:
                messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]

    delay, tasks = 0.0, []
    for index, session in enumerate(sessions):
        tasks.append(run_session(index, session, delay))
        if request_rate != float("inf"):
            delay += rng.expovariate(request_rate)
    await asyncio.gather(*tasks)
    return records, time.perf_counter() - bench_start


async def run_all(base_url: str, options: BenchOptions, tokenizer: Any) -> list[WorkloadResult]:
    import openai  # a dev dependency (requirements-dev.txt): only the benchmark needs a client

    # A connection per request (no keep-alive) and no retries: llama-server drops some requests on reused
    # connections (../shared/peers/README.md), and a retried request would be counted as one that went through.
    http_client = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=3600)
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=options.extra.get("api_key") or "unused",
                                max_retries=0, timeout=3600, http_client=http_client)
    model = (await client.models.list()).data[0].id
    await client.completions.create(model=model, prompt="warm up", max_tokens=4)
    runs = [(name, [model]) for name in options.workloads]
    if options.num_loras:  # the same sessions again, spread over the adapters, right after the base model's run
        adapters = [f"lora{i}" for i in range(options.num_loras)]
        runs = [run for name in options.workloads for run in ((name, [model]), (f"{name}+lora{len(adapters)}",
                                                                                 adapters))]
    results = []
    for name, models in runs:
        sessions = build_sessions(name.partition("+")[0], tokenizer, options.spec)
        records, seconds = await run_workload(client, models, sessions, options.request_rate,
                                              options.max_concurrency, options.spec.seed)
        results.append(WorkloadResult(name, records, seconds))
    await client.close()
    return results


@contextlib.contextmanager
def own_server(engine_flags: list[str], timeout: float = 900.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start `radixlm serve` on a free loopback port; yields its base URL and process; SIGTERM on exit."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port), *engine_flags]
    process = subprocess.Popen(command)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, process, timeout, "radixlm serve")
        yield base_url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(60)


def wait_healthy(base_url: str, process: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Wait until `base_url/health` answers 200; raise if the process exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not _healthy(base_url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready (exit code {process.poll()})")
        time.sleep(0.5)


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def engine_flags(engine_options: dict[str, Any]) -> list[str]:
    """Engine options back into `radixlm serve` flags."""
    flags = []
    for name, value in engine_options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def bench_serve(base_url: str | None, engine_options: dict[str, Any], options: BenchOptions) -> list[WorkloadResult]:
    """Run the workloads against `base_url`, or against a server started with `engine_options`."""
    from radixlm.config import DEFAULT_MODEL

    model_dir = resolve_model_dir(str(engine_options.get("model", DEFAULT_MODEL)))
    tokenizer = load_tokenizer(model_dir)
    with contextlib.ExitStack() as stack:
        flags = engine_flags(engine_options)
        if options.num_loras and base_url is None:  # a running server must have lora0.. loaded already
            adapters = write_random_adapters(model_dir, Path(stack.enter_context(tempfile.TemporaryDirectory())),
                                             options.num_loras, options.lora_rank)
            flags += ["--lora-modules", *[f"{name}={path}" for name, path in adapters],
                      "--max-loras", str(max(options.num_loras, int(engine_options.get("max_loras", 0))))]
        url = base_url or stack.enter_context(own_server(flags))[0]
        results = asyncio.run(run_all(url, options, tokenizer))
    print_table(results, options)
    if options.num_loras:
        print_lora_ratios(results)
    if options.output_json:
        save_json(results, options, options.output_json)
    if options.output_png:
        save_plot(results, options.output_png)
    return results


def print_lora_ratios(results: list[WorkloadResult]) -> None:
    """Each workload's output tok/s with adapters over the base model's (one server, one sitting)."""
    by_name = {result.name: result for result in results}
    for result in results:
        base_name, _, adapters = result.name.partition("+")
        base = by_name.get(base_name)
        if not adapters or base is None:
            continue
        ours, theirs = result.summary()["output_tok_per_s"], base.summary()["output_tok_per_s"]
        if theirs > 0:
            print(f"{result.name}: output tok/s {ours:.1f} vs the base model's {theirs:.1f}: {ours / theirs:.2f}x")
