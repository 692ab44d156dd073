"""Sizes a client controls are capped with a 400 naming the field, before any work is done for them; a request
that could never fit the queue is a 400, not a 429 (retrying could never help)."""

from __future__ import annotations

import time

import pytest

from server.inprocess import InProcessServer


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    server = InProcessServer(tiny_model_dir("llama"), {"num_kv_blocks": 128, "block_size": 4, "max_num_seqs": 8,
                                                       "max_queued_requests": 4})
    yield server
    server.stop()


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 100000}, "n"),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 4, "best_of": 1000000000}, "best_of"),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 4, "n": 9}, "n"),  # more than --max-num-seqs
    ("/v1/completions", {"prompt": ["Hello"] * 20, "max_tokens": 4}, "prompt"),  # more than --max-queued-requests
], ids=["n-100000", "best_of-1e9", "n-over-max-num-seqs", "prompts-over-queue"])
def test_sizes_beyond_the_limits_are_400s_naming_the_field(server, route, body, param):
    started = time.monotonic()
    response = server.http.post(route, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert time.monotonic() - started < 5  # refused before anything was built for it
    assert server.http.get("/health").status_code == 200


def test_requests_at_the_limits_run(server):
    response = server.http.post("/v1/completions", json={"prompt": ["Hello"] * 4, "max_tokens": 3, "n": 2})
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 8
    assert server.wait_for(lambda m: m.get("radixlm:num_requests_running{}") == 0)
