"""Issue 10's server rows, in process: tiny temperatures, unencodable text, oversize integers, prompts that can
never fit, the event loop staying free, failed requests (`RequestOutput.error`), Retry-After, HEAD /health."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from radixlm.core.scheduler import QueueFullError
from radixlm.engine.async_engine import AsyncEngine
from radixlm.engine.llm_engine import LLMEngine
from server.inprocess import InProcessApp

HUGE_PROMPT_CHARS = 12_000_000
FAILING_PROMPT = [7, 7, 7]


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    app = InProcessApp(tiny_model_dir("llama"))
    yield app
    app.close()


def completion_text(app: InProcessApp, **body: object) -> str:
    response = app.post("/v1/completions", {"prompt": "the quick brown", "max_tokens": 6, **body})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def chat_text(app: InProcessApp, **body: object) -> str:
    response = app.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "a paged"}],
                                                 "max_tokens": 6, **body})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def assert_error(response, status: int, param: str | None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def test_tiny_temperatures_answer_greedily(app):
    """Rows: 1e-45 with top_p 0.5 (completions) or min_p 0.5 (chat) crashed the engine; 1e-38 gave garbage."""
    greedy = completion_text(app, temperature=0)
    assert completion_text(app, temperature=1e-45, top_p=0.5) == greedy
    assert completion_text(app, temperature=1e-38) == greedy
    assert completion_text(app, temperature=1e-45, top_p=0.5, min_p=0.5, top_k=3, repetition_penalty=1e300) != ""
    greedy_chat = chat_text(app, temperature=0)
    assert chat_text(app, temperature=1e-45, top_p=0.5, min_p=0.5) == greedy_chat
    assert completion_text(app, temperature=0) == greedy  # the engine is alive and unchanged


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "hi \ud800 there", "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": ["ok", "\udfff"], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stop": ["\ud800"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x\ud800"}], "max_tokens": 2}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}],
                              "max_tokens": 2}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "\ud800"}]}, "messages"),
    ("/tokenize", {"prompt": "\ud800"}, "prompt"),
])
def test_lone_surrogate_is_a_400_naming_the_field(app, path, body, param):
    """Row: a lone surrogate in a prompt or message was a 500 (and the connection was reset)."""
    # json.dumps writes "\ud800" as the escape a client sends; httpx's json= would fail to encode it
    response = app.request("POST", path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    error = assert_error(response, 400, param)
    assert "surrogate" in error["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi", "tool_calls": %s}], "max_tokens": 2}',
     "messages"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 2, "guided_json": %s}', "guided_json"),
])
def test_deep_nesting_is_a_400_naming_the_field(app, path, body, param):
    """Found by probing: a message's extra key nested 900 deep reached the chat template (RecursionError, 500)."""
    deep = '{"a": ' * 900 + "1" + "}" * 900
    response = app.request("POST", path, content=body % deep, headers={"Content-Type": "application/json"})
    assert "nests deeper" in assert_error(response, 400, param)["message"]


def test_oversize_integers_are_400s(app):
    """Row: a logit_bias key of 5,000 digits was a 500 (Python's int-string limit)."""
    assert_error(app.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, "logit_bias": {"9" * 5000: 1}}),
                 400, "logit_bias")
    assert_error(app.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, "logit_bias": {"²": 1}}),
                 400, "logit_bias")
    huge = '{"prompt": "hi", "max_tokens": ' + "9" * 5000 + "}"
    assert_error(app.request("POST", "/v1/completions", content=huge,
                             headers={"Content-Type": "application/json"}), 400, None)
    for field in ("top_k", "min_tokens", "max_tokens", "seed", "priority"):  # n, best_of: the engine caps them
        response = app.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     field: 10**40, "max_tokens": 2} | (
            {"max_tokens": 10**40} if field == "max_tokens" else {}))
        assert response.status_code in (200, 400), (field, response.text)
    assert chat_text(app, top_k=10**40, temperature=0) == chat_text(app, temperature=0)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "x" * HUGE_PROMPT_CHARS, "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * HUGE_PROMPT_CHARS}]}, "messages"),
    ("/tokenize", {"prompt": "x" * HUGE_PROMPT_CHARS}, "prompt"),
])
def test_prompt_that_can_never_fit_is_refused_untokenized(app, path, body, param, monkeypatch):
    """Row: a 15 MB prompt was tokenized on the event loop (14 s for every client)."""
    tokenizer = type(app.app.state.async_engine.info.tokenizer)
    monkeypatch.setattr(tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    start = time.monotonic()
    error = assert_error(app.post(path, body), 400, param, "context_length_exceeded")
    assert "characters" in error["message"]
    assert time.monotonic() - start < 10


def test_health_answers_within_100ms_while_a_12mb_prompt_is_handled(app):
    body = json.dumps({"prompt": "the quick " * (HUGE_PROMPT_CHARS // 10), "max_tokens": 2}).encode()

    async def measure() -> tuple[list[float], int]:  # (the body is encoded beforehand: the client's work is not
        big = app.client.post("/v1/completions", content=body,  # the server's, though here they share a loop)
                              headers={"Content-Type": "application/json"})
        task = asyncio.ensure_future(big)
        # A client asking at any moment waits as long as the loop is busy: measure whole iterations, so that a
        # pause of the loop between two /health calls counts too.
        latencies = []
        while not task.done() or len(latencies) < 5:
            start = time.monotonic()
            await asyncio.sleep(0.01)
            assert (await app.client.get("/health")).status_code == 200
            latencies.append(time.monotonic() - start - 0.01)
        return latencies, (await task).status_code

    latencies, status = app.portal.call(measure)
    assert status == 400
    assert max(latencies) < 0.1, latencies


@pytest.fixture
def failing_requests(monkeypatch):
    """Requests with the marker prompt fail alone, as the engine reports it (RequestOutput.error). Marked by prompt
    in the engine's step: the engine thread may finish a short request before the server's coroutine resumes."""
    original = LLMEngine.step

    def step(self):
        outputs = original(self)
        for output in outputs:
            if output.prompt_token_ids == FAILING_PROMPT:
                output.error = "injected failure"
                output.finished = True
                for sequence in output.outputs:
                    sequence.finish_reason = "error"
        return outputs

    monkeypatch.setattr(LLMEngine, "step", step)
    return FAILING_PROMPT


def test_failed_request_is_a_500_or_an_sse_error_and_never_finish_reason_error(app, failing_requests):
    body = {"prompt": failing_requests, "max_tokens": 4}
    error = assert_error(app.post("/v1/completions", body), 500, None, "request_failed")
    assert "injected failure" in error["message"]
    streamed = app.post("/v1/completions", body | {"stream": True}).text
    events = [line.removeprefix("data: ") for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "injected failure" in json.loads(events[-2])["error"]["message"]
    assert '"finish_reason":"error"' not in streamed.replace(" ", "")
    assert completion_text(app, temperature=0) == completion_text(app, temperature=0)  # others go on


def test_429_and_503_carry_retry_after(app, monkeypatch):
    async def full(*args, **kwargs):
        raise QueueFullError("max_queued_requests=1 requests are waiting")

    monkeypatch.setattr(AsyncEngine, "generate", full)
    response = app.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert_error(response, 429, None, "queue_full")
    assert response.headers["Retry-After"] == "1"
    monkeypatch.setattr(type(app.app.state.async_engine), "unavailable_reason", property(lambda _: "loading"))
    for response in (app.request("GET", "/health"), app.post("/v1/completions", {"prompt": "hi"})):
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"


def test_head_health(app):
    response = app.request("HEAD", "/health")
    assert response.status_code == 200 and response.content == b""
