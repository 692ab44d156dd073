"""`--data-parallel-size 2`: two engine replicas (workers in child processes) behind one server. The router keeps
shared-prefix groups together (prefill tokens computed across replicas vs one replica), spreads random prompts,
aborts reach the replica running the request, and /metrics labels every replica."""

import asyncio
import contextlib
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from radixlm.sampling_params import SamplingParams
from server.harness import start_server
from server.inprocess import InProcessServer, ThreadedServer

PREFIX_LEN = 1000
QUESTION_LEN = 32
GROUPS = 4
QUESTIONS = 8
VOCAB = range(3, 300)  # the tiny tokenizer's ordinary tokens
OPTIONS = {"num_kv_blocks": 1024, "block_size": 16, "num_threads": 1}


def _shared_prefix_prompts() -> list[list[int]]:
    rng = random.Random(0)
    prompts = []
    for _ in range(GROUPS):
        prefix = [rng.choice(VOCAB) for _ in range(PREFIX_LEN)]
        prompts += [prefix + [rng.choice(VOCAB) for _ in range(QUESTION_LEN)] for _ in range(QUESTIONS)]
    return prompts


def _run_concurrently(server, prompts: list[list[int]], max_tokens: int = 2) -> None:
    async def run() -> None:
        async with server.async_client() as client:
            await asyncio.gather(*[client.completions.create(model=server.model_name, prompt=prompt,
                                                             max_tokens=max_tokens, temperature=0)
                                   for prompt in prompts])
    asyncio.run(run())


def _per_replica(metrics: dict[str, float], name: str) -> dict[str, float]:
    """{replica: value} of a metric's samples (replica '' without data parallelism)."""
    values = {}
    for key, value in metrics.items():
        if key.startswith(name + "{"):
            labels = dict(part.split("=", 1) for part in key[len(name) + 1:-1].split(",") if part)
            values[labels.get("replica", "")] = value
    return values


def _computed_prefill(metrics: dict[str, float]) -> dict[str, float]:
    prompt = _per_replica(metrics, "radixlm:prompt_tokens_total")
    cached = _per_replica(metrics, "radixlm:prefix_cache_hit_tokens_total")
    return {replica: prompt[replica] - cached[replica] for replica in prompt}


def _start(model_dir, num_replicas: int) -> InProcessServer:
    server = InProcessServer(model_dir, OPTIONS | {"data_parallel_size": num_replicas})
    server.model_name = str(model_dir)
    return server


@pytest.fixture(scope="module")
def dp_server(long_model_dir):
    server = _start(long_model_dir, 2)
    yield server
    server.stop()


def test_shared_prefix_groups_stay_on_one_replica(long_model_dir, dp_server):
    one = _start(long_model_dir, 1)
    try:
        _run_concurrently(one, _shared_prefix_prompts())
        single = _computed_prefill(one.metrics())[""]
    finally:
        one.stop()
    before = _computed_prefill(dp_server.metrics())
    _run_concurrently(dp_server, _shared_prefix_prompts())
    after = dp_server.metrics()
    computed = {r: v - before[r] for r, v in _computed_prefill(after).items()}
    assert set(computed) == {"0", "1"}
    print(f"computed prefill tokens: one replica {single:.0f}, two replicas {computed}")
    assert sum(computed.values()) <= 1.2 * single, (computed, single)
    routed = dp_server.app.app.state.async_engine.router.num_routed
    assert sorted(routed) == [16, 16], routed  # two groups each


def test_random_prompts_are_spread(dp_server):
    router = dp_server.app.app.state.async_engine.router
    before = list(router.num_routed)
    rng = random.Random(1)
    _run_concurrently(dp_server, [[rng.choice(VOCAB) for _ in range(rng.randint(20, 200))] for _ in range(40)])
    routed = [after - was for after, was in zip(router.num_routed, before, strict=True)]
    # By load: a replica whose requests finish sooner takes more (a fresh-clone run gave 25 / 15), never all.
    assert min(routed) >= 0.3 * 40, routed
    # every finished request leaves its replica's load (the event loop hears of the end just after the client does)
    dp_server.wait_for(lambda m: router.loads == [0, 0], timeout=10, what="the loads back to zero")


def test_metrics_have_a_replica_label(dp_server):
    metrics = dp_server.metrics()
    for name in ("radixlm:num_requests_running", "radixlm:prompt_tokens_total", "radixlm:kv_cache_usage_perc"):
        assert set(_per_replica(metrics, name)) == {"0", "1"}, name
    assert "process_resident_memory_bytes{}" in metrics  # the server process, once


def test_abort_by_id_reaches_the_replica_running_the_request(dp_server):
    engine = dp_server.app.app.state.async_engine
    # A phantom request makes one replica look busier, so the real one goes to the other (which replica takes the
    # phantom depends on what earlier tests routed: ties go to the smaller prefix index).
    busy = engine.router.route(list(range(3, 67))).replica
    expected = 1 - busy
    before = dp_server.metrics()

    async def run() -> tuple[int | None, str | None]:
        stream = await engine.generate("abort-me", [[5, 6, 7]], SamplingParams(max_tokens=3000, ignore_eos=True))
        replica = engine.replica_of("abort-me")
        engine.abort(["abort-me", "unknown-id"])
        outputs = [output async for _, output in stream]
        return replica, outputs[-1].outputs[0].finish_reason

    try:
        assert dp_server.app.portal.call(run) == (expected, "abort")
    finally:
        engine.router.finish(busy)
    after = dp_server.wait_for(lambda m: engine.router.loads == [0, 0], what="the loads back to zero")
    key = "radixlm:request_finished_total{finished_reason=abort,replica=%s}"
    assert after.get(key % expected, 0) - before.get(key % expected, 0) == 1
    assert after.get(key % busy, 0) == before.get(key % busy, 0)


def test_health_needs_every_replica(dp_server):
    assert dp_server.http.get("/health").status_code == 200
    replicas = dp_server.app.app.state.async_engine.replicas
    replicas[1].info, info = None, replicas[1].info  # as while replica 1 still loads
    try:
        assert dp_server.http.get("/health").status_code == 503
    finally:
        replicas[1].info = info


def test_a_client_disconnect_aborts_on_the_right_replica(long_model_dir):
    server = ThreadedServer(long_model_dir, engine_options=OPTIONS | {"data_parallel_size": 2})
    try:
        engine = server.app.state.async_engine
        busy = engine.router.route(list(range(3, 67))).replica  # it looks busier: the request goes to the other
        expected = 1 - busy
        body = {"model": str(long_model_dir), "prompt": "the quick brown fox", "max_tokens": 3000,
                "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=server.base_url, timeout=60) as client, \
                client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            next(response.iter_lines())
        key = "radixlm:request_finished_total{finished_reason=abort,replica=%s}"
        aborted = server.wait_for(lambda m: m.get(key % expected) == 1, what="the abort on the other replica")
        assert aborted.get(key % busy, 0) == 0
        engine.router.finish(busy)
        server.wait_for(lambda m: engine.router.loads == [0, 0], timeout=10, what="the loads back to zero")
    finally:
        server.stop()


def _worker_pids(server_pid: int) -> list[int]:
    """The server's model workers: forked from its forkserver (radixlm.worker.launch), so its grandchildren."""
    return [process.pid for process in psutil.Process(server_pid).children(recursive=True)
            if process.ppid() != server_pid]


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_a_failed_replica_fails_the_requests_and_ends_the_server(long_model_dir, tmp_path):
    server = start_server(long_model_dir, tmp_path, "--data-parallel-size", "2", "--num-kv-blocks", "512")
    with ThreadPoolExecutor(1) as pool:
        try:
            long_request = pool.submit(server.http.post, "/v1/completions", json={
                "prompt": "the quick brown fox", "max_tokens": 4000, "ignore_eos": True}, timeout=120)
            server.wait_for(lambda m: sum(_per_replica(m, "radixlm:num_requests_running").values()) == 1,
                            what="the long request running")
            workers = _worker_pids(server.process.pid)
            assert len(workers) == 2, workers
            before = [_cpu_ticks(pid) for pid in workers]
            time.sleep(1.0)
            busy = [_cpu_ticks(pid) - was for pid, was in zip(workers, before, strict=True)]
            idle_worker = workers[busy.index(min(busy))]
            os.kill(idle_worker, signal.SIGKILL)  # the replica without the long request loses its model worker
            started = time.monotonic()
            statuses = []
            while server.process.poll() is None and time.monotonic() - started < 30:
                with contextlib.suppress(httpx.TransportError):  # short requests go to the less loaded: the broken one
                    statuses.append(server.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                                                     timeout=10).status_code)
            assert server.process.wait(10) == 1, server.log()
            # the less loaded replica is the broken one: a dead worker stops its engine at once (WorkerDiedError), so a
            # request that reached it fails (500) and the rest find the server stopping (503), then it exits
            assert statuses and statuses[0] in (500, 503) and set(statuses[1:]) <= {503}, statuses
            assert long_request.result().status_code == 503  # the healthy replica's request failed too, not hung
        finally:  # a failed check must not leave the server and its workers running
            server.stop(signal.SIGKILL)
    assert "replica 1 failed" in server.log() or "replica 0 failed" in server.log(), server.log()


def test_replica_options_run_workers_in_processes_trace_to_their_own_files_and_share_the_cores():
    from radixlm.data_parallel.engine import replica_engine_options

    options = {"data_parallel_size": 2, "trace": "/tmp/run.jsonl", "num_threads": 1}
    assert replica_engine_options(options, 1) == {"data_parallel_size": 2, "trace": "/tmp/run.replica1.jsonl",
                                                  "num_threads": 1, "distributed_executor_backend": "mp"}
    assert replica_engine_options({"distributed_executor_backend": "uni"}, 0) == {
        "distributed_executor_backend": "uni"}  # the user's choice stands
    # Without --num-threads the replicas share the cores, as tensor-parallel ranks do.
    import torch

    for num_replicas in (2, 3, 64):
        shared = replica_engine_options({"data_parallel_size": num_replicas}, 1)
        assert shared["num_threads"] == max(1, torch.get_num_threads() // num_replicas)


def test_lora_adapters_load_on_every_replica_and_answer_as_one_engine_does(long_model_dir, tmp_path):
    """(One engine's adapter answers equal PEFT's: tests/e2e/test_lora_matches_peft.py.)"""
    from lora_adapters import build_adapter

    from radixlm.llm import LLM
    from radixlm.lora_request import LoRARequest

    adapter = build_adapter(long_model_dir, tmp_path / "a1", seed=1)
    prompts = [[rng.choice(VOCAB) for _ in range(24)] for rng in [random.Random(i) for i in range(4)]]
    one = LLM(str(long_model_dir), **OPTIONS, enable_lora=True)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = [output.outputs[0].text for output in one.generate(prompts, params, use_tqdm=False,
                                                                   lora_request=LoRARequest("a1", 1, str(adapter)))]
    one.close()
    server = InProcessServer(long_model_dir, OPTIONS | {"data_parallel_size": 2, "enable_lora": True})
    try:
        reply = server.http.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(adapter)})
        assert reply.status_code == 200, reply.text
        replicas = server.app.app.state.async_engine.replicas
        assert [sorted(replica.lora_requests) for replica in replicas] == [["a1"], ["a1"]]
        for prompt, text in zip(prompts, expected, strict=True):
            answer = server.http.post("/v1/completions", json={"model": "a1", "prompt": prompt, "max_tokens": 6,
                                                               "temperature": 0, "ignore_eos": True})
            assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == text
        assert server.http.post("/v1/unload_lora_adapter", json={"lora_name": "a1"}).status_code == 200
        assert [replica.lora_requests for replica in replicas] == [{}, {}]
    finally:
        server.stop()
