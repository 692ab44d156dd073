"""A trace of `radixlm bench serve` (multi-turn, concurrent, with a client that disconnects) replays with zero
divergences: arrivals and aborts that reach the engine between steps are recorded at the step they precede."""

from __future__ import annotations

import contextlib

import httpx

from radixlm.bench.serve import BenchOptions, bench_serve
from radixlm.bench.serve_workloads import WorkloadSpec
from radixlm.trace.replay import Trace, replay
from server.inprocess import ThreadedServer


def test_a_served_multi_turn_trace_replays_exactly(long_model_dir, tiny_model_dir, tmp_path):
    trace_path = tmp_path / "serve-trace.jsonl"
    server = ThreadedServer(long_model_dir, engine_options={"num_kv_blocks": 1100, "block_size": 4,
                                                            "max_num_batched_tokens": 64, "trace": str(trace_path)})
    try:
        spec = WorkloadSpec(num_prompts=16, input_len=(16, 48), output_len=(4, 12), prefix_len=64, seed=0)
        options = BenchOptions(["multi-turn", "shared-prefix"], spec, max_concurrency=8)
        bench_serve(server.base_url, {"model": str(tiny_model_dir("llama"))}, options)
        with contextlib.suppress(httpx.TimeoutException):  # a client that gives up: its abort reaches the engine
            server.http.post("/v1/completions", json={"prompt": "x " * 40, "max_tokens": 3500, "ignore_eos": True},
                             timeout=0.3)
        tagged = server.http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "metadata": {"user": "ada", "run": "7"}})
        assert tagged.status_code == 200, tagged.text
        for bad in ({f"k{i}": "v" for i in range(17)}, {"k": "v" * 513}, {"k": 5}, ["k"]):
            response = server.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "metadata": bad})
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"].startswith("metadata"), response.text
        server.wait_for(lambda m: m.get("radixlm:num_requests_running{}") == 0)
    finally:
        server.stop()
    trace = Trace.load(trace_path)
    assert len(trace.of("arrival")) >= 34 and trace.of("abort")
    assert trace.of("arrival")[-1]["metadata"] == {"user": "ada", "run": "7"}  # OpenAI's metadata, as sent
    assert trace.of("finish")[-1]["metadata"] == {"user": "ada", "run": "7"}
    num_matched, divergence = replay(trace)
    assert divergence is None, str(divergence)
    assert num_matched == len(trace.of("step")) > 50
