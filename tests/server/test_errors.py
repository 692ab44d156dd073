"""Bad requests get OpenAI's error body with the right status and param; the queue limit (429) holds.

One in-process server for the module: API key on, one running sequence at a time, one waiting request at most, a
64 KiB body limit, and a tiny model with a 4096-token context so that a long generation outlasts a burst.
(A disconnect mid-stream needs a socket: test_lifecycle.py.)
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from server.harness import API_KEY, LONG_CONTEXT
from server.inprocess import InProcessServer

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"prompt": "the quick", "max_tokens": 4}


@pytest.fixture(scope="module")
def server(long_model_dir):
    server = InProcessServer(long_model_dir, {"max_num_seqs": 1, "max_queued_requests": 1,
                                              "num_kv_blocks": LONG_CONTEXT // 4 + 8, "block_size": 4},
                             api_key=API_KEY, max_request_bytes=65536)
    yield server
    server.stop()


def chat(**changes):
    return ("/v1/chat/completions", {**CHAT, **changes})


def completion(**changes):
    return ("/v1/completions", {**COMPLETION, **changes})


# (id, (path, json body), status, param, words the message must contain)
BAD_REQUESTS = [
    ("temperature-negative", chat(temperature=-1), 400, "temperature", ["temperature", "-1"]),
    ("temperature-not-a-number", chat(temperature="hot"), 400, "temperature", ["temperature"]),
    ("top-p-zero", chat(top_p=0), 400, "top_p", ["top_p"]),
    ("top-k-below-minus-one", completion(top_k=-2), 400, "top_k", ["top_k"]),
    ("n-zero", chat(n=0), 400, "n", ["n must"]),
    ("max-tokens-zero", completion(max_tokens=0), 400, "max_tokens", ["max_tokens"]),
    ("min-tokens-above-max", completion(min_tokens=10), 400, "min_tokens", ["min_tokens"]),
    ("best-of-below-n", completion(n=2, best_of=1), 400, "best_of", ["best_of"]),
    ("presence-penalty-range", chat(presence_penalty=3), 400, "presence_penalty", ["presence_penalty"]),
    ("frequency-penalty-type", chat(frequency_penalty="abc"), 400, "frequency_penalty", ["frequency_penalty"]),
    ("top-logprobs-too-many", chat(logprobs=True, top_logprobs=50), 400, "top_logprobs", ["20"]),
    ("top-logprobs-without-logprobs", chat(top_logprobs=2), 400, "top_logprobs", ["logprobs"]),
    ("completion-logprobs-too-many", completion(logprobs=21), 400, "logprobs", ["20"]),
    ("logit-bias-bad-key", chat(logit_bias={"abc": 1}), 400, "logit_bias", ["logit_bias"]),
    ("logit-bias-outside-vocab", chat(logit_bias={"999999": 1}), 400, "logit_bias", ["999999"]),
    ("stop-token-outside-vocab", chat(stop_token_ids=[999999]), 400, "stop_token_ids", ["999999"]),
    ("priority-without-policy", chat(priority=1), 400, "priority", ["priority"]),
    ("stream-options-without-stream", chat(stream_options={"include_usage": True}), 400, "stream_options",
     ["stream"]),
    ("messages-empty", chat(messages=[]), 400, "messages", ["messages"]),
    ("messages-missing", ("/v1/chat/completions", {"max_tokens": 4}), 400, "messages", ["messages"]),
    ("content-part-image", chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400, "messages.0.content.0.type",
     ["image_url"]),
    ("content-part-text-missing", chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), 400,
     "messages.0.content.0.text", ["text string"]),
    ("tools-auto-not-enabled", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tool_choice",
     ["--enable-auto-tool-choice"]),
    ("functions", chat(functions=[{"name": "f"}]), 400, "functions", ["functions"]),
    ("response-format-unknown-type", chat(response_format={"type": "xml"}), 400, "response_format",
     ["response_format", "json_schema"]),
    ("response-format-schema-missing", chat(response_format={"type": "json_schema"}), 400, "response_format",
     ["json_schema", "schema"]),
    ("json-schema-not-compilable", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no-such-type"}}}), 400, "response_format", ["invalid json_schema"]),
    ("json-schema-url-ref", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "http://example.com/s.json"}}}), 400, "response_format",
     ["nothing is fetched"]),
    ("json-schema-not", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "not": {"const": 1}}}}), 400, "response_format", ["'not'"]),
    ("guided-json-all-of", chat(guided_json={"allOf": [{"type": "integer"}, {"minimum": 5}]}), 400, "guided_json",
     ["'allOf' with 2 schemas"]),
    ("tool-schema-url-ref", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "file:///etc/passwd"}}}], tool_choice="required"), 400, "tools.0.function.parameters",
     ["nothing is fetched"]),
    ("regex-not-compilable", completion(regex="a(b"), 400, "regex", ["invalid regex", "parenthesis"]),
    ("ebnf-not-compilable", chat(ebnf="root ::= ( "), 400, "ebnf", ["invalid ebnf", "EBNF"]),
    ("choice-empty", chat(choice=[]), 400, "choice", ["choice", "non-empty"]),
    ("two-grammars", chat(regex="a+", choice=["a"]), 400, "choice", ["regex", "one structured-output field"]),
    ("guided-json-not-json", chat(guided_json="{oops"), 400, "guided_json", ["not valid JSON"]),
    ("suffix", completion(suffix="!"), 400, "suffix", ["suffix"]),
    ("prompt-empty-list", completion(prompt=[]), 400, "prompt", ["prompt"]),
    ("prompt-an-object", completion(prompt={"a": 1}), 400, "prompt", ["prompt"]),  # not "prompt.str"
    # JSON types as sent (strict): true is not 1, "yes" is not true, 2.0 is not an integer
    ("n-true", completion(n=True), 400, "n", ["integer"]),
    ("stream-yes", completion(stream="yes"), 400, "stream", ["boolean"]),
    ("prompt-bools", completion(prompt=[True, False]), 400, "prompt", ["prompt"]),
    ("max-tokens-float", completion(max_tokens=2.0), 400, "max_tokens", ["integer"]),
    ("stop-token-id-string", completion(stop_token_ids=["1"]), 400, "stop_token_ids.0", ["integer"]),
    ("metadata-key-too-long", completion(metadata={"k" * 70: "v"}), 400, "metadata", ["metadata"]),
    ("prompt-empty-string", completion(prompt=""), 400, "prompt", ["prompt"]),
    ("prompt-token-outside-vocab", completion(prompt=[1, 2, 10**6]), 400, "prompt", ["1000000"]),
    ("prompt-longer-than-context", completion(prompt=[5] * 5000), 400, "prompt", ["5000", str(LONG_CONTEXT)]),
    ("prompt-plus-max-tokens-too-long", completion(prompt=[5] * 4000, max_tokens=200), 400, "max_tokens",
     ["4200", str(LONG_CONTEXT)]),
    ("unknown-model", chat(model="gpt-4"), 404, "model", ["gpt-4"]),
    ("body-is-a-list", ("/v1/chat/completions", [1, 2]), 400, None, ["JSON object"]),
]


def check_error_body(response: httpx.Response, status: int, param: str | None, words: list[str]) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    assert error["param"] == param, error
    for word in words:
        assert word in error["message"], error


@pytest.mark.parametrize(("path_body", "status", "param", "words"), [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request_gets_openai_error(server, path_body, status, param, words):
    path, body = path_body
    check_error_body(server.http.post(path, json=body), status, param, words)


def test_transport_level_errors(server):
    # Malformed JSON is a 400 (OpenAI and vLLM), not FastAPI's 422.
    check_error_body(server.http.post("/v1/chat/completions", content=b'{"messages": [', headers={
        "Content-Type": "application/json"}), 400, None, ["JSON"])
    big = json.dumps({**CHAT, "padding": "x" * 70000})
    check_error_body(server.http.post("/v1/chat/completions", content=big, headers={
        "Content-Type": "application/json"}), 413, None, [])
    chunked = (part for part in [b'{"prompt": "', b"x" * 40000, b"x" * 40000, b'"}'])  # no Content-Length
    check_error_body(server.http.post("/v1/completions", content=chunked, headers={
        "Content-Type": "application/json"}), 413, None, ["65536"])
    check_error_body(server.http.post("/v1/completions", data={"prompt": "x"}), 400, None, ["Content-Type"])
    for body, words in ((b'{"prompt": "x", "seed": 1' + b"1" * 5000 + b"}", ["parsed as JSON", "digits"]),
                        (b'{"prompt": "\xff\xfe"}', ["not valid UTF-8"]),
                        (b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}", ["nests too deeply"])):
        response = server.http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        check_error_body(response, 400, None, words)
        assert response.json()["error"]["code"] == "json_invalid"
    check_error_body(server.http.get("/v1/nowhere"), 404, None, [])
    without_key = server.http_client(with_key=False)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = without_key.post("/v1/chat/completions", json=CHAT, headers=headers)
        check_error_body(response, 401, None, ["API key"])
    assert without_key.get("/health").status_code == 200  # health and metrics need no key
    assert without_key.get("/metrics").status_code == 200


def test_openai_client_sees_typed_errors(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    client = server.client()
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], temperature=-1)
    assert raised.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    # the engine survived all of the above
    assert client.completions.create(model=model, prompt="hi", max_tokens=3).usage.completion_tokens == 3


def test_queue_limit_gives_429(server):
    """With one request running and one waiting the server is full: the rest get 429 and nothing is lost."""
    model = server.client().models.list().data[0].id

    async def run() -> tuple[object, list[object]]:
        client = server.async_client()
        long_one = asyncio.ensure_future(client.completions.create(
            model=model, prompt="the quick", max_tokens=3000, temperature=0, extra_body={"ignore_eos": True}))
        while server.metrics()["radixlm:num_requests_running{}"] < 1:
            await asyncio.sleep(0.01)
        burst = await asyncio.gather(*(client.completions.create(model=model, prompt="hi", max_tokens=20,
                                                                 temperature=0) for _ in range(6)),
                                     return_exceptions=True)
        return await long_one, burst

    long_one, burst = asyncio.run(run())
    refused = [r for r in burst if isinstance(r, openai.RateLimitError)]
    served = [r for r in burst if not isinstance(r, Exception)]
    assert len(refused) + len(served) == len(burst), burst
    assert refused and served  # the first of the burst waits, the others find the queue full
    assert long_one.usage.completion_tokens == 3000 and all(r.usage.completion_tokens > 0 for r in served)
    error = refused[0].body
    assert error["code"] == "queue_full" and "max_queued_requests=1" in error["message"]
    assert server.metrics()["radixlm:num_requests_waiting{}"] == 0
