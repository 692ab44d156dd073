"""Generated values holding markup tags reach the client whole, on the tiny model over HTTP (issue 34, rows 4, 5):
a forced call whose schema requires `</tool_call>` in an argument is a tool call, and with `--reasoning-parser
qwen3` a JSON answer or call holding `</think>` is neither split nor taken for reasoning."""

from __future__ import annotations

import json

import pytest

from radixlm.server.chat_options import ChatOptions
from server.inprocess import InProcessApp

TAGGED = "a</tool_call>b</think>c<tool_call>"
SCHEMA = {"type": "object", "properties": {"x": {"type": "string", "enum": [TAGGED]}}, "required": ["x"]}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
MESSAGES = [{"role": "user", "content": "go"}]
LONG = {"num_kv_blocks": 1024}


@pytest.fixture(scope="module", params=[None, "qwen3", "deepseek_r1"])
def app(request, long_model_dir):
    app = InProcessApp(long_model_dir, LONG, chat_options=ChatOptions(
        chat_template="smollm2_tools", tool_call_parser="hermes", reasoning_parser=request.param))
    app.reasoning_parser = request.param
    yield app
    app.close()


def chat(app, **fields) -> dict:
    response = app.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 200, "temperature": 0,
                                                 **_no_free_thinking(app), **fields})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def _no_free_thinking(app) -> dict:
    """deepseek_r1's output opens in a free think block: a random model fills max_tokens with it, so skip it."""
    return {"chat_template_kwargs": {"enable_thinking": False}} if app.reasoning_parser == "deepseek_r1" else {}


def streamed(app, **fields) -> tuple[str, str, list]:
    response = app.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 200, "temperature": 0,
                                                 "stream": True, **_no_free_thinking(app), **fields})
    reasoning, content, calls = "", "", []
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"]
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                if call.get("id"):
                    calls.append([call["function"]["name"], ""])
                calls[call["index"]][1] += call["function"].get("arguments") or ""
    return reasoning, content, calls


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_a_forced_call_holding_tags_is_a_call(app, tool_choice):
    # one call: a random model would write parallel calls until max_tokens cuts the last one
    choice = chat(app, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False)
    message = choice["message"]
    assert not message["content"] and not message.get("reasoning_content"), message
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("f", {"x": TAGGED})]
    reasoning, content, calls = streamed(app, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False)
    assert (reasoning, content) == ("", "") and [(n, json.loads(a)) for n, a in calls] == [("f", {"x": TAGGED})]


def test_a_json_answer_holding_tags_is_content(app):
    """Without thinking (the random model, free to think first under qwen3, thinks until max_tokens): the grammar
    holds the answer alone, and none of it is reasoning. Thinking first is tested on the grammar's own output in
    tests/unit/test_tags_in_generated_text.py."""
    response_format = {"type": "json_schema", "json_schema": {"name": "tagged", "schema": SCHEMA}}
    no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
    message = chat(app, response_format=response_format, **no_thinking)["message"]
    assert json.loads(message["content"]) == {"x": TAGGED} and not message.get("reasoning_content"), message
    reasoning, content, _ = streamed(app, response_format=response_format, **no_thinking)
    assert reasoning == "" and json.loads(content) == {"x": TAGGED}
