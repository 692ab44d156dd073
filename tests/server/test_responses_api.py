"""POST /v1/responses (and GET / DELETE /v1/responses/{id}) through the official openai client, on the tiny
random-weight Llama served with the shipped smollm2_tools template and the hermes tool parser: a response renders
the conversation as the equivalent chat request does, structured outputs and forced tool calls hold, streams agree
with whole responses, a stored response's continuation hits the prefix cache, and bad requests are 400s naming the
field. Reasoning items come from a server with `--reasoning-parser deepseek_r1`."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from radixlm.reasoning import get_reasoning_parser
from radixlm.sample.sampler import Sampler
from radixlm.server.chat_options import ChatOptions
from radixlm.server.chat_output import OutputParsing, SequenceParser
from radixlm.server.openai_responses.bodies import MAX_INPUT_ITEMS
from radixlm.server.openai_responses.events import OutputAssembler
from radixlm.server.openai_responses.input_items import chat_messages
from radixlm.server.openai_responses.store import ResponseStore
from radixlm.server.request_bodies import MAX_CONTENT_PARTS
from radixlm.tool_parsers import get_tool_parser
from server.inprocess import InProcessServer

LONG = {"num_kv_blocks": 1024}  # the tiny tokenizer spends about a token a character on the tool list
TOOL_OPTIONS = dict(chat_template="smollm2_tools", tool_call_parser="hermes", enable_auto_tool_choice=True)
CITY = {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather forecast", "strict": True,
           "parameters": {"type": "object", "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1,
                                                                                   "maximum": 7}},
                          "required": ["city", "days"], "additionalProperties": False}}
PING = {"type": "function", "name": "ping"}
AS_CHAT_TOOL = {"type": "function",
                "function": {key: WEATHER[key] for key in ("name", "description", "parameters", "strict")}}
# keys deliberately not in alphabetical order; every value finite, so the grammar always ends the answer
PAIR_SCHEMA = {"type": "object", "properties": {"zeta": {"type": "boolean"},
                                                "alpha": {"type": "integer", "minimum": 0, "maximum": 9}},
               "required": ["zeta", "alpha"], "additionalProperties": False}
PAIR_FORMAT = {"format": {"type": "json_schema", "name": "pair", "schema": PAIR_SCHEMA, "strict": True}}
GREEDY = dict(temperature=0, max_output_tokens=8)


@pytest.fixture(scope="module")
def server(long_model_dir):
    server = InProcessServer(long_model_dir, LONG, chat_options=ChatOptions(**TOOL_OPTIONS))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def chat(client, model, messages, **fields):
    return client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=8, **fields)


def test_string_input_is_one_user_message(client, model):
    response = client.responses.create(model=model, input="the quick brown fox", **GREEDY)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == model
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert message.id.startswith("msg_") and response.output_text == message.content[0].text
    usage = response.usage
    assert usage.output_tokens == 8 and usage.total_tokens == usage.input_tokens + 8
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert (response.temperature, response.top_p, response.tool_choice, response.tools) == (0, 1, "auto", [])
    reference = chat(client, model, [{"role": "user", "content": "the quick brown fox"}])
    assert response.output_text == reference.choices[0].message.content
    assert usage.input_tokens == reference.usage.prompt_tokens


def test_items_and_instructions_render_as_chat_messages(client, model):
    items = [{"role": "developer", "content": "Answer in French."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "the quick"},
                                                             {"type": "input_text", "text": "brown fox"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "jumps"}]},
             {"role": "user", "content": "over the lazy dog"}]
    response = client.responses.create(model=model, input=items, instructions="You are terse.", **GREEDY)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "the quick\nbrown fox"}, {"role": "assistant", "content": "jumps"},
                {"role": "user", "content": "over the lazy dog"}]
    reference = chat(client, model, messages)
    assert response.output_text == reference.choices[0].message.content
    assert response.usage.input_tokens == reference.usage.prompt_tokens
    assert response.instructions == "You are terse."


def test_json_schema_format_parses_validates_and_keeps_the_schemas_key_order(client, model):
    response = client.responses.create(model=model, input="the quick brown fox", text=PAIR_FORMAT,
                                       temperature=0, max_output_tokens=60)
    assert response.status == "completed" and response.output[0].status == "completed"
    answer = json.loads(response.output_text)
    jsonschema.validate(answer, PAIR_SCHEMA)
    assert list(answer) == ["zeta", "alpha"]
    assert response.text.format.type == "json_schema"

    class Pair(BaseModel):
        zeta: bool
        alpha: int

    parsed = client.responses.parse(model=model, input="the quick brown fox", text_format=Pair, temperature=0,
                                    max_output_tokens=60)
    assert isinstance(parsed.output_parsed, Pair)


def test_forced_tool_choice_gives_one_valid_function_call(client, model):
    for tool_choice, parallel in (({"type": "function", "name": "get_weather"}, True), ("required", False)):
        response = client.responses.create(model=model, input="weather in Oslo?", tools=[WEATHER, PING],
                                           tool_choice=tool_choice, parallel_tool_calls=parallel, temperature=0,
                                           max_output_tokens=100)
        calls = [item for item in response.output if item.type == "function_call"]
        assert len(calls) == 1 and response.status == "completed", response.output
        assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
        if calls[0].name == "get_weather":
            jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
        assert response.tools[0].name == "get_weather"
        assert response.tool_choice == "required" if parallel is False else response.tool_choice.name == "get_weather"


def test_function_call_output_is_fed_back_as_a_tool_message(client, model):
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Oslo", "days": 2}'}
    items = [{"role": "user", "content": "weather in Oslo?"}, call,
             {"type": "function_call_output", "call_id": "call_1", "output": "rain"}]
    response = client.responses.create(model=model, input=items, tools=[WEATHER], tool_choice="none", **GREEDY)
    messages = [{"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": call["arguments"]}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    reference = chat(client, model, messages, tools=[AS_CHAT_TOOL], tool_choice="none")
    assert response.output_text == reference.choices[0].message.content
    assert response.usage.input_tokens == reference.usage.prompt_tokens


def test_stream_helper_events_come_in_order_and_agree_with_the_whole_response(client, model):
    whole = client.responses.create(model=model, input="the quick brown fox", text=PAIR_FORMAT, temperature=0,
                                    max_output_tokens=60)
    with client.responses.stream(model=model, input="the quick brown fox", text=PAIR_FORMAT, temperature=0,
                                 max_output_tokens=60) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [event.type for event in events]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas) and deltas
    assert types[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.id == events[0].response.id and final.usage.output_tokens == whole.usage.output_tokens


def test_create_stream_true_text_and_tool_calls(client, model):
    whole = client.responses.create(model=model, input="the quick brown fox", **GREEDY)
    events = list(client.responses.create(model=model, input="the quick brown fox", stream=True, **GREEDY))
    assert [event.type for event in events][-4:] == ["response.output_text.done", "response.content_part.done",
                                                     "response.output_item.done", "response.incomplete"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.status == "incomplete" and events[-1].response.output_text == whole.output_text
    forced = dict(model=model, input="weather?", tools=[WEATHER], tool_choice={"type": "function",
                                                                               "name": "get_weather"},
                  temperature=0, max_output_tokens=100)
    [call] = [item for item in client.responses.create(**forced).output if item.type == "function_call"]
    events = list(client.responses.create(stream=True, **forced))
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(fragments) > 1 and "".join(fragments) == done.arguments == call.arguments
    assert events[-1].type == "response.completed"


def test_sse_frames_name_their_event(server):
    response = server.http.post("/v1/responses", json={"input": "hi", "stream": True, **GREEDY})
    frames = [frame.splitlines() for frame in response.text.strip().split("\n\n")]
    assert response.headers["content-type"].startswith("text/event-stream")
    for lines in frames:
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        assert json.loads(lines[1][6:])["type"] == lines[0][7:]
    assert "[DONE]" not in response.text


def test_previous_response_id_continues_the_conversation_from_the_prefix_cache(client, model):
    first = client.responses.create(model=model, input="the quick brown fox", **GREEDY)
    second = client.responses.create(model=model, input="the lazy dog", previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 2 > 0
    reference = chat(client, model, [{"role": "user", "content": "the quick brown fox"},
                                     {"role": "assistant", "content": first.output_text},
                                     {"role": "user", "content": "the lazy dog"}])
    assert second.usage.input_tokens == reference.usage.prompt_tokens
    assert second.output_text == reference.choices[0].message.content
    third = client.responses.create(model=model, input="again", previous_response_id=second.id, **GREEDY)
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens // 2


def test_retrieve_delete_and_store_false(client, model, server):
    response = client.responses.create(model=model, input="the quick brown fox", metadata={"run": "7"},
                                       user="u1", **GREEDY)
    got = client.responses.retrieve(response.id)
    assert (got.id, got.output_text, got.metadata, got.user) == (response.id, response.output_text, {"run": "7"},
                                                                 "u1")
    client.responses.delete(response.id)
    for call in (lambda: client.responses.retrieve(response.id), lambda: client.responses.delete(response.id)):
        with pytest.raises(openai.NotFoundError) as error:
            call()
        assert error.value.body["code"] == "response_not_found"
    unknown = server.http.get("/v1/responses/resp_unknown")
    assert unknown.status_code == 404 and set(unknown.json()["error"]) == {"message", "type", "param", "code"}
    unstored = client.responses.create(model=model, input="x", store=False, **GREEDY)
    assert server.http.get(f"/v1/responses/{unstored.id}").status_code == 404
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(model=model, input="y", previous_response_id=unstored.id, **GREEDY)
    assert error.value.body["param"] == "previous_response_id"


def test_a_request_failing_mid_stream_ends_with_error_and_failed(server, client, model, monkeypatch):
    """A fault in this request's sampling row (injected after two tokens) fails it alone: the stream ends with an
    `error` event and `response.failed` holding the output so far; unstreamed, it is a 500."""
    adjust = Sampler._adjust_logits

    def adjust_or_fail(self, logits, batch, requests, num_outputs, *args):
        if any(r.sampling_params.temperature == 0.25 and r.num_output_tokens >= 2 for r in requests):
            raise FloatingPointError("injected sampler fault")
        return adjust(self, logits, batch, requests, num_outputs, *args)

    monkeypatch.setattr(Sampler, "_adjust_logits", adjust_or_fail)
    fields = dict(model=model, input="the quick brown fox", temperature=0.25, max_output_tokens=8)
    events = list(client.responses.create(stream=True, **fields))
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert "injected sampler fault" in events[-2].message and events[-2].code == "request_failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "request_failed" and len(failed.output) == 1
    assert server.http.get(f"/v1/responses/{failed.id}").status_code == 404  # a failed response is not stored
    with pytest.raises(openai.InternalServerError):
        client.responses.create(**fields)
    assert client.responses.create(**(fields | {"temperature": 0})).status == "incomplete"  # the others go on


def test_store_evicts_by_count_bytes_and_age():
    now = [0.0]
    store = ResponseStore(max_entries=3, max_bytes=1000, ttl_seconds=10, clock=lambda: now[0])
    for name in "abcd":
        assert store.put(name, {"id": name}, [])  # 13 bytes each
    assert store.get("a") is None and len(store) == 3  # the oldest left for the fourth
    assert store.put("big", {"id": "big", "text": "x" * 950}, [])  # 977 bytes: b and c leave to make room
    assert [store.get(name) is not None for name in "bcd"] == [False, False, True] and store.num_bytes == 990
    assert not store.put("huge", {"text": "x" * 2000}, []) and store.get("huge") is None  # larger than the store
    assert store.get("d") is not None  # and it evicted nothing
    now[0] = 10.0
    assert store.get("big") is None and len(store) == 0 and store.num_bytes == 0  # expired
    assert store.put("e", {"id": "e"}, [{"role": "user", "content": "hi"}]) and store.delete("e")
    assert not store.delete("e") and store.num_bytes == 0


BASE = {"input": "hi", "max_output_tokens": 2}
USER = {"role": "user", "content": "x"}
BAD = [
    ({"input": []}, "input", "at least one"),
    ({"input": [1]}, "input.0", ""),
    ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role", "one of"),
    ({"input": [{"role": "user", "content": 5}]}, "input.0.content", "string"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input.0.content.0.type", "text only"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * (MAX_CONTENT_PARTS + 1)}]},
     "input.0.content", "limit"),
    ({"input": [USER] * (MAX_INPUT_ITEMS + 1)}, "input", "limit"),
    ({"input": [USER, {"type": "item_reference", "id": "msg_1"}]}, "input.1.type", "not supported"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id", "string"),
    ({"input": [USER, {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]},
     "input.1.output.0.type", "text only"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}, USER]},
     "input.0.encrypted_content", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type", "built-in"),
    ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools.0.name", "letters"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nonsense"}}], "tool_choice": "required"},
     "tools.0.parameters", ""),
    ({"tools": [{"type": "function", "name": "f", "defer_loading": True}]}, "tools.0.defer_loading", "supported"),
    ({"tools": [PING], "tool_choice": {"type": "file_search"}}, "tool_choice", "not supported"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [PING], "tool_choice": "sometimes"}, "tool_choice", '{"type": "function", "name": ...}'),
    ({"input": "the " * 50_000}, "input", "context"),
    ({"tools": [PING], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format",
     "cannot be combined"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "JSON schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format", "json_schema"),
    ({"text": {"verbosity": "low"}}, "text.verbosity", "not supported"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort", "not supported"),
    ({"background": True}, "background", "not supported"),
    ({"conversation": "conv_1"}, "conversation", "not supported"),
    ({"include": ["message.output_text.logprobs"]}, "include", "not supported"),
    ({"truncation": "auto"}, "truncation", "not supported"),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"max_output_tokens": 10**6}, "max_output_tokens", "context"),
    ({"temperature": -1.0}, "temperature", "temperature"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", ""),
    ({"stream": "yes"}, "stream", ""),
    ({"previous_response_id": ""}, "previous_response_id", ""),
]


@pytest.mark.parametrize(("fields", "param", "words"), BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_bad_requests_are_400_naming_the_field(server, fields, param, words):
    response = server.http.post("/v1/responses", json=BASE | fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_unknown_previous_response_and_model_are_404(server):
    response = server.http.post("/v1/responses", json=BASE | {"previous_response_id": "resp_nope"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "previous_response_not_found"
    response = server.http.post("/v1/responses", json=BASE | {"model": "nope"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_reasoning_parser_output_becomes_a_reasoning_item(long_model_dir, client, model):
    """deepseek_r1: text without </think> is all reasoning (the random model never closes the block)."""
    plain = client.responses.create(model=model, input="the quick brown fox", **GREEDY).output_text
    thinking = InProcessServer(long_model_dir, LONG, chat_options=ChatOptions(chat_template="smollm2_tools",
                                                                              reasoning_parser="deepseek_r1"))
    try:
        reasoner = thinking.client()
        response = reasoner.responses.create(model=model, input="the quick brown fox", **GREEDY)
        [item] = response.output
        assert item.type == "reasoning" and item.id.startswith("rs_") and item.content[0].text == plain
        assert response.output_text == "" and 0 < response.usage.output_tokens_details.reasoning_tokens <= 8
        events = list(reasoner.responses.create(model=model, input="the quick brown fox", stream=True, **GREEDY))
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == plain
        assert [e.text for e in events if e.type == "response.reasoning_text.done"] == [plain]
        follow_up = reasoner.responses.create(model=model, input="go on", previous_response_id=response.id,
                                              **GREEDY)
        assert follow_up.usage.input_tokens_details.cached_tokens > 0
    finally:
        thinking.stop()


def test_reasoning_text_and_call_make_three_items_streamed_or_whole_and_read_back_as_one_message():
    parsing = OutputParsing(get_reasoning_parser("deepseek_r1"), get_tool_parser("hermes"))
    text = '<think>I need the weather.</think>Let me look. <tool_call>{"name": "w", "arguments": {"c": 1}}</tool_call>'
    whole = OutputAssembler()
    whole.feed(SequenceParser(parsing).feed(text, final=True))
    whole.finish(incomplete=False)
    streamed, parser, types = OutputAssembler(), SequenceParser(parsing), []
    for i in range(0, len(text), 3):
        types += [e["type"] for e in streamed.feed(parser.feed(text[i:i + 3], final=i + 3 >= len(text)))]
    types += [e["type"] for e in streamed.finish(incomplete=False)]

    def shape(items):
        return [item.model_dump(exclude={"id", "call_id"}) for item in items]

    assert shape(streamed.items) == shape(whole.items)
    assert [item.type for item in whole.items] == ["reasoning", "message", "function_call"]
    assert whole.items[0].content[0].text == "I need the weather." and whole.items[2].arguments == '{"c": 1}'
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 3
    items = [item.model_dump(mode="json") for item in whole.items]
    [message] = chat_messages(items, [f"input.{i}" for i in range(3)]).messages
    assert message["reasoning_content"] == "I need the weather." and message["content"].startswith("Let me look.")
    assert message["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"c": 1}'}
