"""One client's tokenizer work cannot hold up another's (issue 34, row 3), on `radixlm serve` with the default
model's real tokenizer: everything a chat template is given counts toward the refusal before templating (tools and
assistant tool-call arguments were templated and tokenized, 5.4 M tokens in 10 s, before the 400), and tiny
requests are answered while big prompts are tokenized (they waited for all of them, 10.8 s in the probe)."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow
BIG_PROMPT_CHARS = 600_000  # under what 8,192 tokens can hold, so it is tokenized (~0.5 s), then refused


@pytest.fixture(scope="module")
def server(default_tool_server):
    return default_tool_server


def post(server, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:  # a connection each, as separate clients
        return http.post(path, json=body)


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
      "tools": [{"type": "function", "function": {"name": f"f{i}", "description": "d" * 100_000}}
                for i in range(128)]}, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "a" * 12_000_000}}]}],
     "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"}, "messages"),
])
def test_everything_templated_is_counted_before_templating(server, body, param):
    response = post(server, "/v1/chat/completions", {**body, "max_tokens": 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == param, error
    assert "it was not tokenized" in error["message"]


def test_tiny_requests_are_not_held_up_by_big_prompts(server):
    prompt = ("lorem ipsum dolor sit amet " * (BIG_PROMPT_CHARS // 27 + 1))[:BIG_PROMPT_CHARS]
    statuses: list[int] = []
    big = [threading.Thread(target=lambda: statuses.append(post(server, "/v1/completions", {
        "prompt": prompt, "max_tokens": 1}).status_code)) for _ in range(6)]
    for thread in big:
        thread.start()
    latencies = []
    while any(thread.is_alive() for thread in big):
        started = time.monotonic()
        assert post(server, "/tokenize", {"prompt": "hello there"}).status_code == 200
        latencies.append(time.monotonic() - started)
        time.sleep(0.05)
    assert statuses == [400] * 6  # tokenized in full (~0.5 s each, one at a time), then refused as too long
    assert len(latencies) >= 10, latencies
    assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0, sorted(latencies)
