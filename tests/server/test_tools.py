"""Tool calling over HTTP on the tiny random-weight model: forced choices always parse and validate (constrained
decoding), streaming agrees with non-streaming, history with tool calls renders, and bad input is a 400 naming
the field. The app serves the shipped smollm2_tools template with the hermes parser."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.server.chat_options import ChatOptions
from radixlm.server.tool_calling import MAX_TOOLS
from server.inprocess import InProcessApp

CITY = {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": {
        "type": "object", "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "book_trip", "parameters": {
        "type": "object", "properties": {"route": {"type": "object", "properties": {"from": CITY, "to": CITY},
                                                   "required": ["from", "to"]},
                                         "seats": {"type": "array", "items": {"type": "integer", "minimum": 1,
                                                                              "maximum": 9}, "maxItems": 2}},
        "required": ["route", "seats"]}}},
    {"type": "function", "function": {"name": "ping"}},
]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}
MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


LONG = {"num_kv_blocks": 1024}  # the tiny tokenizer spends about a token a character on the tool list


@pytest.fixture(scope="module")
def app(long_model_dir):
    app = InProcessApp(long_model_dir, LONG, chat_options=ChatOptions(
        chat_template="smollm2_tools", tool_call_parser="hermes", enable_auto_tool_choice=True))
    yield app
    app.close()


def chat(app, **fields):
    return app.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 400, "temperature": 0, **fields})


def streamed_message(app, **fields) -> tuple[dict, str, int]:
    """The stream folded into one message (as a client folds it), the finish reason, and how many argument
    fragments came."""
    response = chat(app, stream=True, **fields)
    assert response.status_code == 200, response.text
    content, calls, finish, num_fragments = "", [], None, 0
    for line in response.text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        delta, finish = choice["delta"], choice["finish_reason"] or finish
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            if "id" in call:
                assert call["index"] == len(calls) and call["function"]["arguments"] == ""
                calls.append({"name": call["function"]["name"], "arguments": ""})
            else:
                assert "name" not in call["function"]
                calls[call["index"]]["arguments"] += call["function"]["arguments"]
                num_fragments += 1
    return {"content": content or None, "tool_calls": calls}, finish, num_fragments


def calls_of(message: dict) -> list[dict]:
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in message.get("tool_calls") or []]


def test_required_always_calls_valid_tools_and_streaming_agrees(app):
    """With parallel calls the random model may go on calling until max_tokens; every complete call validates."""
    for seed, parallel in ((0, False), (1, False), (2, True), (3, True)):
        fields = dict(tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed, parallel_tool_calls=parallel)
        response = chat(app, **fields)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        calls = calls_of(choice["message"])
        assert calls and all(c["id"].startswith("call_") for c in choice["message"]["tool_calls"])
        for call in calls:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        if not parallel:
            assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
            assert len(calls) == 1
        streamed, finish, num_fragments = streamed_message(app, **fields)
        assert (streamed, finish) == ({"content": choice["message"]["content"], "tool_calls": calls},
                                      choice["finish_reason"])
        assert num_fragments > 3 * len(calls)  # forced calls stream their arguments as they are generated


def test_named_choice_calls_that_function_once(app):
    for name in ("book_trip", "ping"):
        choice = {"type": "function", "function": {"name": name}}
        response = chat(app, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=3)
        calls = calls_of(response.json()["choices"][0]["message"])
        assert [c["name"] for c in calls] == [name]
        jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[name])
        # A named choice ends with "stop", as OpenAI's and vLLM's do ("required" ends with "tool_calls").
        assert response.json()["choices"][0]["finish_reason"] == "stop"
        streamed, finish, _ = streamed_message(app, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=3)
        assert finish == "stop" and streamed["tool_calls"] == calls


def test_parallel_tool_calls_false_gives_one_call(app):
    response = chat(app, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=1)
    assert len(response.json()["choices"][0]["message"]["tool_calls"]) == 1


def test_auto_and_none_leave_random_text_as_content(app):
    for tool_choice in ("auto", "none"):
        response = chat(app, tools=TOOLS, tool_choice=tool_choice, max_tokens=8)
        message = response.json()["choices"][0]["message"]
        assert response.status_code == 200 and "tool_calls" not in message and isinstance(message["content"], str)


def test_tool_result_round_trips_through_the_template(app):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    body = {"messages": history, "tools": TOOLS, "tool_choice": "none", "max_tokens": 4}
    assert app.post("/v1/chat/completions", body).status_code == 200
    tokens = app.post("/tokenize", {"messages": history}).json()["tokens"]
    text = app.post("/detokenize", {"tokens": tokens}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>' in text
    assert "<tool_response>\nrain\n</tool_response>" in text


FUNCTION_F = {"type": "function", "function": {"name": "f"}}
BAD = [
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not in tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "required"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
      "tool_choice": "required"}, "tools.0.function.parameters", "nonsense"),
    ({"tools": [FUNCTION_F, FUNCTION_F]}, "tools.1.function.name", "twice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", "letters"),
    ({"tools": [FUNCTION_F] * (MAX_TOOLS + 1)}, "tools", "at most"),
    ({"tools": "f"}, "tools", "list"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "tokenize"),
    ({"chat_template_kwargs": {"a b": 1}}, "chat_template_kwargs", "variable"),
]


@pytest.mark.parametrize("arguments", ['{"city": "Os', "{not json", "[" * 2000])  # the last: json's RecursionError
def test_history_with_arguments_that_are_not_json_is_accepted(app, arguments):
    """A call cut off by max_tokens comes back in the history as the client got it: vLLM accepts it, and so do we
    (the template gets the text as it is)."""
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    response = chat(app, messages=history, tools=TOOLS, tool_choice="none", max_tokens=2)
    assert response.status_code == 200, response.text
    tokens = app.post("/tokenize", {"messages": history}).json()["tokens"]
    assert arguments[:12].replace('"', "") in app.post("/detokenize", {"tokens": tokens}).json()["prompt"].replace(
        '\\"', "").replace('"', "")


@pytest.mark.parametrize(("fields", "param", "words"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_tool_requests_are_400_naming_the_field(app, fields, param, words):
    response = chat(app, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_auto_needs_the_server_flag(long_model_dir):
    plain = InProcessApp(long_model_dir, LONG)
    try:
        response = chat(plain, tools=TOOLS)
        assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"
        response = chat(plain, tools=TOOLS, tool_choice="required")  # forced choices need no parser flag
        assert response.json()["choices"][0]["finish_reason"] == "tool_calls"
    finally:
        plain.close()


def test_reasoning_parser_splits_reasoning_streaming_and_not(long_model_dir, app):
    """deepseek_r1: text without </think> is all reasoning (the random model never closes the block)."""
    plain_text = chat(app, max_tokens=12).json()["choices"][0]["message"]["content"]
    thinking = InProcessApp(long_model_dir, LONG, chat_options=ChatOptions(chat_template="smollm2_tools",
                                                                          reasoning_parser="deepseek_r1"))
    try:
        message = chat(thinking, max_tokens=12).json()["choices"][0]["message"]
        assert message["reasoning_content"] == plain_text and message["content"] == ""
        response = chat(thinking, max_tokens=12, stream=True)
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in response.text.splitlines()
                  if line.startswith("data: {")]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == plain_text
        assert not any(d.get("content") for d in deltas)
    finally:
        thinking.close()


def test_none_without_tools_is_accepted_and_tokenize_renders_tools(app):
    assert chat(app, tool_choice="none", max_tokens=2).status_code == 200
    tokens = app.post("/tokenize", {"messages": MESSAGES, "tools": TOOLS[:1]}).json()["tokens"]
    assert '"name": "get_weather"' in app.post("/detokenize", {"tokens": tokens}).json()["prompt"]
    response = app.post("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools.0"
