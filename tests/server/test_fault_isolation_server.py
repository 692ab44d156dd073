"""What clients see of engine faults: a request's own failure is its 500 alone; an engine that cannot go on
answers 503 on /health and the process exits non-zero within seconds."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from server.harness import free_port, launch

HERE = Path(__file__).parent
GOOD = {"prompt": "hello there", "max_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def faulty_server(tiny_model_dir, tmp_path):
    port = free_port()
    command = [sys.executable, f"{HERE}/faulty_engine_server.py", "--model", str(tiny_model_dir("llama")),
               "--port", str(port), "--num-kv-blocks", "128", "--block-size", "4", "--num-threads", "1"]
    server = launch(command, tmp_path / "server.log", port)
    server.wait_ready()
    yield server
    server.stop()


def test_a_request_that_fails_alone_gets_500_and_the_others_200(faulty_server):
    http = faulty_server.http
    alone = http.post("/v1/completions", json=GOOD).json()["choices"][0]["text"]
    with ThreadPoolExecutor(4) as pool:
        goods = [pool.submit(http.post, "/v1/completions", json=GOOD) for _ in range(3)]
        bad = pool.submit(http.post, "/v1/completions", json={**GOOD, "top_k": 7, "temperature": 1})
        bad, goods = bad.result(), [g.result() for g in goods]
    assert bad.status_code == 500, bad.text
    assert "injected sampler fault" in bad.json()["error"]["message"]
    assert all(g.status_code == 200 and g.json()["choices"][0]["text"] == alone for g in goods)
    with http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "top_k": 7, "stream": True}) as stream:
        events = [line[len("data: "):] for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "injected sampler fault" in json.loads(events[-2])["error"]["message"]
    assert http.get("/health").status_code == 200
    assert http.post("/v1/completions", json=GOOD).json()["choices"][0]["text"] == alone


def test_an_engine_that_cannot_go_on_fails_health_and_exits_non_zero(faulty_server):
    http = faulty_server.http
    response = http.post("/v1/completions", json={**GOOD, "top_k": 13, "temperature": 1})
    assert response.status_code == 503, response.text
    started = time.monotonic()
    health = None
    while faulty_server.process.poll() is None and time.monotonic() - started < 10:
        with contextlib.suppress(httpx.TransportError):
            health = http.get("/health", timeout=1).status_code
        time.sleep(0.1)
    assert faulty_server.process.wait(10) == 1, faulty_server.log()
    assert health in (None, 503)
    assert "injected broken invariant" in faulty_server.log()
