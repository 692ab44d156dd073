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
    ("/v1/completions", {"prompt": [[1, 2, 3]] * 30000, "max_tokens": 4}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}] * 5000, "max_tokens": 4}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 2000}],
                              "max_tokens": 4}, "messages.0.content"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}] * 5000}, "messages"),
    ("/detokenize", {"tokens": [1] * 200_000}, "tokens"),
    ("/v1/completions", {"prompt": "Hello", "logit_bias": {str(i): 1 for i in range(1_000_000)}}, "logit_bias"),
    ("/v1/completions", {"prompt": "Hello", "stop_token_ids": [1] * 5000}, "stop_token_ids"),
    # JSON nested too deeply for the parser inside a string: a RecursionError used to become a 500
    ("/v1/completions", {"prompt": "x", "guided_json": "[" * 100_000 + "]" * 100_000}, "guided_json"),
    ("/v1/completions", {"prompt": "x", "json_schema": '{"type":"array","items":' * 880 + '{"type":"string"}'
                                                       + "}" * 880}, "json_schema"),
    ("/v1/completions", {"prompt": "x", "regex": "(ab|cd)" * 10_000}, "regex"),
    ("/v1/completions", {"prompt": "x", "choice": ["a" * 1_000_000]}, "choice"),
    ("/v1/completions", {"prompt": "x", "guided_choice": [f"option {i}" for i in range(100_000)]}, "guided_choice"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "string", "pattern": "a" * 20_000}}}},
     "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"pattern": "a" * 20_000}}}}}],
        "tool_choice": "none"}, "tools.0.function.parameters"),
], ids=["n-100000", "best_of-1e9", "n-over-max-num-seqs", "prompts-over-queue", "token-prompts-30000",
        "messages-5000", "content-parts-2000", "tokenize-messages-5000", "detokenize-200000", "logit-bias-1e6",
        "stop-token-ids-5000", "schema-string-nested-100000", "schema-nested-880", "regex-70000-chars",
        "choice-of-1e6-chars", "choices-100000", "schema-pattern-20000-chars", "tool-schema-pattern-20000-chars"])
def test_sizes_beyond_the_limits_are_400s_naming_the_field(server, route, body, param):
    started = time.monotonic()
    response = server.http.post(route, json=body)
    assert response.status_code == 400, response.text[:500]
    assert response.json()["error"]["param"] == param, response.text[:500]
    assert time.monotonic() - started < 5  # refused before anything was built for it
    assert server.http.get("/health").status_code == 200


def test_requests_at_the_limits_run(server):
    response = server.http.post("/v1/completions", json={"prompt": ["Hello"] * 4, "max_tokens": 3, "n": 2})
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 8
    assert server.wait_for(lambda m: m.get("radixlm:num_requests_running{}") == 0)


def test_prompts_per_request_are_capped_before_any_is_tokenized(tiny_model_dir):
    server = InProcessServer(tiny_model_dir("llama"), {"num_kv_blocks": 128, "block_size": 4,
                                                       "max_prompts_per_request": 3})
    try:
        response = server.http.post("/v1/completions", json={"prompt": ["Hello"] * 4, "max_tokens": 2})
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
        assert "at most 3 (--max-prompts-per-request)" in response.json()["error"]["message"]
        response = server.http.post("/v1/completions", json={"prompt": ["Hello"] * 3, "max_tokens": 2})
        assert response.status_code == 200 and len(response.json()["choices"]) == 3
    finally:
        server.stop()
