"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official anthropic SDK, on the
tiny random-weight model with the shipped smollm2_tools template and the hermes parser: replies, stop reasons,
streaming (equal to the whole reply), forced tool use, tool results, token counts, and errors in Anthropic's shape.

The server is behind a loopback socket (ThreadedServer): the SDK runs on httpx2, whose transports are not httpx's,
so the in-process ASGI transport cannot carry it.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

import radixlm.server.anthropic_messages.handler as handler_module
from radixlm.reasoning import get_reasoning_parser
from radixlm.server.anthropic_messages.blocks import ContentAssembler
from radixlm.server.anthropic_messages.bodies import MessagesRequest
from radixlm.server.anthropic_messages.translate import translate
from radixlm.server.chat_options import ChatOptions
from radixlm.server.chat_output import OutputParsing, SequenceParser
from server.harness import API_KEY
from server.inprocess import ThreadedServer

MAX_BODY_BYTES = 256 * 1024
CITY = {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}
TOOLS = [
    {"name": "get_weather", "description": "Weather forecast", "input_schema": {
        "type": "object", "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}},
    {"name": "ping", "input_schema": {"type": "object", "properties": {}}},
]
SCHEMAS = {tool["name"]: tool["input_schema"] for tool in TOOLS}
SYSTEM = "You are terse."
CONVERSATION = [{"role": "user", "content": "the quick brown fox"},
                {"role": "assistant", "content": "jumps over"},
                {"role": "user", "content": [{"type": "text", "text": "the lazy"}, {"type": "text", "text": "dog"}]}]
HISTORY = [{"role": "user", "content": "weather in Oslo?"},
           {"role": "assistant", "content": [
               {"type": "text", "text": "Let me look."},
               {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo", "days": 2}}]},
           {"role": "user", "content": [
               {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}]},
               {"type": "text", "text": "and tomorrow?"}]}]
# HISTORY as the chat request it translates to
CHAT_HISTORY = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {
                        "name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
                {"role": "user", "content": "and tomorrow?"}]


@pytest.fixture(scope="module")
def server(long_model_dir):
    server = ThreadedServer(long_model_dir, engine_options={"num_kv_blocks": 1024}, api_key=API_KEY,
                            max_request_bytes=MAX_BODY_BYTES, chat_options=ChatOptions(
                                chat_template="smollm2_tools", tool_call_parser="hermes",
                                enable_auto_tool_choice=True))
    yield server
    server.stop()


def anthropic_client(server, api_key: str = API_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server):
    return anthropic_client(server)


@pytest.fixture(scope="module")
def model(server):
    return server.http.get("/v1/models").json()["data"][0]["id"]


SAMPLING = ("temperature", "top_p", "top_k")  # the SDK's create() no longer takes them: they go as extra_body


def create(client, model, **fields):
    """messages.create, greedy unless `temperature` says otherwise."""
    fields = {"max_tokens": 12, "temperature": 0, "messages": CONVERSATION} | fields
    extra_body = {name: fields.pop(name) for name in SAMPLING if name in fields} | fields.pop("extra_body", {})
    return client.messages.create(model=model, extra_body=extra_body, **fields)


def test_create_with_system_and_multi_turn(client, model):
    for system in (SYSTEM, [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]):
        message = create(client, model, system=system, top_k=5, top_p=0.9, metadata={"user_id": "u-1"})
        assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
        assert message.model == model and message.stop_reason in ("end_turn", "max_tokens")
        assert [block.type for block in message.content] in (["text"], [])
        assert 0 < message.usage.output_tokens <= 12 and message.usage.input_tokens > 0
        assert message.usage.cache_read_input_tokens is not None
    # a string system prompt and its one-block form make the same prompt, and the same greedy reply
    assert create(client, model, system=SYSTEM).content == message.content


def test_stop_sequence_and_max_tokens(client, model):
    full = create(client, model, max_tokens=24)
    text = full.content[0].text
    assert len(text) >= 4, text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    stopped = create(client, model, max_tokens=24, stop_sequences=["never-generated", stop])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert stopped.content[0].text == text[:text.index(stop)]
    short = create(client, model, max_tokens=3)
    assert (short.stop_reason, short.stop_sequence, short.usage.output_tokens) == ("max_tokens", None, 3)


def content_of(message) -> list[dict]:
    """The content blocks as sent (a streamed message's blocks also carry the SDK's own `parsed_output`)."""
    return [{key: value for key, value in block.to_dict().items() if key != "parsed_output"}
            for block in message.content]


def test_stream_equals_the_whole_reply(client, model):
    whole = create(client, model, system=SYSTEM, max_tokens=16)
    with client.messages.stream(model=model, system=SYSTEM, messages=CONVERSATION, max_tokens=16,
                                extra_body={"temperature": 0}) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == whole.content[0].text
    assert (content_of(final), final.stop_reason, final.stop_sequence) == (content_of(whole), whole.stop_reason,
                                                                          None)
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert (final.usage.input_tokens + final.usage.cache_read_input_tokens
            == whole.usage.input_tokens + whole.usage.cache_read_input_tokens)
    events = [event.type for event in create(client, model, system=SYSTEM, max_tokens=16, stream=True)]
    num_deltas = len(events) - 5
    assert events == ["message_start", "content_block_start", *["content_block_delta"] * num_deltas,
                      "content_block_stop", "message_delta", "message_stop"] and num_deltas > 0


def test_stream_events_on_the_wire(server, model):
    """Each event is `event: <type>` then `data: {..."type": <type>}`; a ping follows message_start."""
    response = server.http.post("/v1/messages", json={"model": model, "max_tokens": 4, "messages": CONVERSATION,
                                                      "stream": True}, headers={"x-api-key": API_KEY})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = [frame.split("\n") for frame in response.text.strip().split("\n\n")]
    names = []
    for event_line, data_line in frames:
        name = event_line.removeprefix("event: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == name
        names.append(name)
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    start = json.loads(frames[0][1][6:])["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0


def tool_uses(message) -> list[tuple[str, dict]]:
    calls = [(block.name, block.input) for block in message.content if block.type == "tool_use"]
    for name, arguments in calls:
        jsonschema.validate(arguments, SCHEMAS[name])
    return calls


def test_forced_tool_use_validates_and_streams(client, model):
    for tool_choice, names in (({"type": "any", "disable_parallel_tool_use": True}, {"get_weather", "ping"}),
                               ({"type": "tool", "name": "get_weather"}, {"get_weather"})):
        fields = dict(tools=TOOLS, tool_choice=tool_choice, max_tokens=200)
        message = create(client, model, **fields)
        calls = tool_uses(message)
        assert len(calls) == 1 and calls[0][0] in names and message.stop_reason == "tool_use", message
        assert all(block.id.startswith("toolu_") for block in message.content if block.type == "tool_use")
        with client.messages.stream(model=model, messages=CONVERSATION, extra_body={"temperature": 0},
                                    **fields) as stream:
            deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
            final = stream.get_final_message()
        assert tool_uses(final) == calls and final.stop_reason == "tool_use"
        assert deltas.count("input_json_delta") > 1  # forced calls stream their input as it is generated


def test_tool_result_round_trip_and_count_tokens(client, server, model):
    fields = dict(system=SYSTEM, messages=HISTORY, tools=TOOLS)
    counted = client.messages.count_tokens(model=model, **fields).input_tokens
    # the Messages conversation renders exactly as the chat conversation it stands for
    tokenized = server.http.post("/tokenize", json={"messages": CHAT_HISTORY, "tools": [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"],
                                          **({"description": t["description"]} if "description" in t else {})}}
        for t in TOOLS]}).json()
    assert counted == tokenized["count"]
    message = create(client, model, tool_choice={"type": "none"}, **fields)
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == counted
    assert all(block.type == "text" for block in message.content)
    fresh = create(client, model, system="a fresh system prompt, said once", max_tokens=2)
    counted_fresh = client.messages.count_tokens(model=model, system="a fresh system prompt, said once",
                                                 messages=CONVERSATION).input_tokens
    assert fresh.usage.input_tokens + fresh.usage.cache_read_input_tokens == counted_fresh


def test_tool_result_error_and_thinking_translate():
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 2000, "thinking": {
        "type": "enabled", "budget_tokens": 1024}, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": [1]}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "no",
                                      "is_error": True}]}]})
    chat = translate(body, reasoning=True).request
    assert chat.chat_template_kwargs == {"enable_thinking": True}
    assistant = chat.messages[1].model_dump(exclude_none=True)
    assert assistant["reasoning_content"] == "hmm" and assistant["tool_calls"][0]["function"] == {
        "name": "f", "arguments": '{"a": [1]}'}
    assert chat.messages[2].model_dump(exclude_none=True) == {"role": "tool", "tool_call_id": "t1",
                                                              "content": "Error: no"}
    disabled = MessagesRequest.model_validate({"model": "m", "max_tokens": 5, "thinking": {"type": "disabled"},
                                               "messages": [{"role": "user", "content": "hi"}]})
    assert translate(disabled, reasoning=True).request.chat_template_kwargs == {"enable_thinking": False}
    assert translate(disabled, reasoning=False).request.chat_template_kwargs is None


def test_reasoning_becomes_a_thinking_block_streamed_or_whole():
    parsing = OutputParsing(reasoning=get_reasoning_parser("qwen3"))
    text = "<think>let me see</think>the answer"
    whole = ContentAssembler()
    whole.feed(SequenceParser(parsing).feed(text, final=True))
    whole.finish()
    streamed, parser, events = ContentAssembler(), SequenceParser(parsing), []
    for i, char in enumerate(text):
        events += streamed.feed(parser.feed(char, final=i == len(text) - 1))
    events += streamed.finish()
    blocks = [block.model_dump() for block in whole.blocks()]
    assert blocks == [{"type": "thinking", "thinking": "let me see", "signature": ""},
                      {"type": "text", "text": "the answer"}]
    assert [block.model_dump() for block in streamed.blocks()] == blocks
    kinds = [(event.type, event.data.get("delta", {}).get("type")) for event in events]
    assert kinds[0] == ("content_block_start", None) and ("content_block_delta", "thinking_delta") in kinds
    assert kinds.count(("content_block_stop", None)) == 2


def anthropic_error(raised: pytest.ExceptionInfo, error_type: str, *words: str) -> None:
    body = raised.value.body
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    for word in words:
        assert word in body["error"]["message"], body


USER = [{"role": "user", "content": "hi"}]
BAD = [
    ("temperature-type", dict(temperature="hot"), ["temperature"]),
    ("temperature-range", dict(temperature=-1), ["temperature"]),
    ("max-tokens-zero", dict(max_tokens=0), ["max_tokens"]),
    ("image-block", dict(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]),
     ["messages.0.content", "'image'"]),
    ("document-block", dict(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]),
     ["'document'"]),
    ("redacted-thinking", dict(messages=[*USER, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "x"}]}, *USER]), ["'redacted_thinking'"]),
    ("image-in-tool-result", dict(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                          "content": [{"type": "image"}]}]}]),
     ["'image'"]),
    ("tool-result-from-assistant", dict(messages=[*USER, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}, *USER]), ["messages.1.content.0"]),
    ("prefill", dict(messages=[*USER, {"role": "assistant", "content": "Sure"}]), ["messages.1", "prefill"]),
    ("role", dict(messages=[{"role": "system", "content": "hi"}]), ["messages.0.role"]),
    ("container", dict(extra_body={"container": "c-1"}), ["container"]),
    ("mcp-servers", dict(extra_body={"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}),
     ["mcp_servers"]),
    ("server-tool", dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), ["web_search"]),
    ("thinking-without-parser", dict(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 1024}),
     ["--reasoning-parser"]),
    ("thinking-budget", dict(thinking={"type": "enabled", "budget_tokens": 1024}), ["budget_tokens"]),
    ("tool-choice-tool-unnamed", dict(tools=TOOLS, tool_choice={"type": "tool"}), ["name"]),
    ("tool-choice-unknown-tool", dict(tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), ["not in tools"]),
    ("tool-schema", dict(tools=[{"name": "f", "input_schema": {"type": "nonsense"}}], tool_choice={"type": "any"}),
     ["tools.0.input_schema"]),
    ("tool-name", dict(tools=[{"name": "bad name!", "input_schema": {"type": "object"}}],
                       tool_choice={"type": "any"}), ["tools.0.name"]),
    ("stop-empty", dict(stop_sequences=[""]), ["stop_sequences"]),
    ("stop-too-many", dict(stop_sequences=[f"s{i}" for i in range(65)]), ["stop_sequences", "64"]),
    ("tools-too-many", dict(tools=[{"name": f"f{i}", "input_schema": {"type": "object"}} for i in range(129)]),
     ["tools", "128"]),
    ("blocks-too-many", dict(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}] * 1025}]),
     ["1024"]),
    ("messages-too-many", dict(messages=USER * 4097), ["messages", "4096"]),
    ("messages-empty", dict(messages=[]), ["messages"]),
    ("context", dict(max_tokens=100_000), ["context length"]),
]


@pytest.mark.parametrize(("fields", "words"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_requests_are_anthropic_400s(client, model, fields, words):
    with pytest.raises(anthropic.BadRequestError) as raised:
        create(client, model, **({"max_tokens": 4, "messages": USER} | fields))
    anthropic_error(raised, "invalid_request_error", *words)


def test_missing_fields_and_malformed_json(server, model):
    for body, words in (({"model": model, "messages": USER}, ["max_tokens"]), ({"max_tokens": 4, "messages": USER},
                                                                               ["model"])):
        response = server.http.post("/v1/messages", json=body)
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
        assert all(word in response.json()["error"]["message"] for word in words)
    for body, word in ((b"{not json", "JSON"),
                       (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate")):
        response = server.http.post("/v1/messages/count_tokens", content=body,
                                    headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
        assert word in response.json()["error"]["message"]


def test_not_found_auth_size_and_server_errors_in_anthropic_shape(server, client, model, monkeypatch):
    with pytest.raises(anthropic.NotFoundError) as raised:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=USER)
    anthropic_error(raised, "not_found_error", "claude-sonnet-4-5")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-sonnet-4-5", messages=USER)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        anthropic_client(server, api_key="wrong").messages.create(model=model, max_tokens=4, messages=USER)
    anthropic_error(raised, "authentication_error", "API key")
    # the OpenAI header works here too, and the OpenAI paths keep OpenAI's body
    bearer = server.http.post("/v1/messages/count_tokens", json={"model": model, "messages": USER})
    assert bearer.status_code == 200 and bearer.json()["input_tokens"] > 0
    assert server.http_client(with_key=False).post("/v1/chat/completions", json={}).json()["error"]["code"] == \
        "invalid_api_key"
    assert server.http.get("/v1/messages/nope").json()["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.APIStatusError) as raised:
        create(client, model, messages=[{"role": "user", "content": "x" * MAX_BODY_BYTES}])
    assert raised.value.status_code == 413
    anthropic_error(raised, "request_too_large", "--max-request-bytes")

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(handler_module, "translate", broken)
    with pytest.raises(anthropic.InternalServerError) as raised:
        create(client, model)
    anthropic_error(raised, "api_error", "a bug")


def test_error_mid_stream_is_an_error_event(client, model, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug at the end")

    monkeypatch.setattr(handler_module, "stop_reason_of", broken)
    seen = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        for event in create(client, model, stream=True):
            seen.append(event.type)
    assert seen[0] == "message_start" and "message_stop" not in seen
    anthropic_error(raised, "api_error", "a bug at the end")
