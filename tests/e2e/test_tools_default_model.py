"""Tool calling on the default model through `radixlm serve` with the shipped smollm2_tools template, driven by the
official openai client and by LangChain's `ChatOpenAI.bind_tools`: forced choices always parse and validate,
streaming agrees with non-streaming, and a tool result round-trips."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

pytestmark = pytest.mark.slow

CITY = {"type": "string", "maxLength": 8}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a place",
                                      "parameters": {"type": "object", "properties": {
                                          "place": {"type": "object", "properties": {
                                              "city": CITY, "country": {"enum": ["FR", "NO", "PE", "US"]}},
                                                    "required": ["city", "country"]},
                                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                          "required": ["place", "days"]}}},
    {"type": "function", "function": {"name": "book_flight", "description": "Book a flight for passengers",
                                      "parameters": {"type": "object", "properties": {
                                          "route": {"type": "object", "properties": {
                                              "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                              "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                                                    "required": ["from", "to"]},
                                          "passengers": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
                                              "type": "object", "properties": {
                                                  "name": {"type": "string", "maxLength": 8},
                                                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                                              "required": ["name", "age"]}}},
                                          "required": ["route", "passengers"]}}},
    {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm",
                                      "parameters": {"type": "object", "properties": {
                                          "time": {"type": "object", "properties": {
                                              "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                              "minute": {"type": "integer", "minimum": 0, "maximum": 59}},
                                                   "required": ["hour", "minute"]},
                                          "label": {"type": "string", "maxLength": 8}},
                                          "required": ["time", "label"]}}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
QUESTIONS = ["What's the weather in Paris this week?", "Book me a flight from Oslo to Lima.",
             "Wake me up at 7:30 tomorrow.", "Will it rain in Oslo in 3 days?"]


@pytest.fixture(scope="module")
def server(default_tool_server):
    return default_tool_server


def ask(client, question: str, **fields):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}], tools=TOOLS,
                                          max_tokens=160, **fields)


def valid_calls(message) -> list[tuple[str, dict]]:
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    for name, arguments in calls:
        jsonschema.validate(arguments, SCHEMAS[name])
    return calls


def test_twenty_required_requests_all_call_valid_tools(server):
    client = server.client()
    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(lambda i: ask(client, QUESTIONS[i % 4], tool_choice="required", temperature=0.8,
                                                seed=i, parallel_tool_calls=False), range(20)))
    for response in responses:
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls" and len(valid_calls(choice.message)) == 1, choice


def streamed_calls(client, question: str, **fields) -> tuple[list[str], list[str]]:
    names, arguments = [], []
    for chunk in ask(client, question, stream=True, **fields):
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if call.function.name:
                names.append(call.function.name)
                arguments.append("")
            arguments[call.index] += call.function.arguments or ""
    return names, arguments


def test_named_choice_and_streaming_agree(server):
    client = server.client()
    cases = [("set_alarm", QUESTIONS[0]), ("book_flight", QUESTIONS[2])]
    forced = [dict(tool_choice={"type": "function", "function": {"name": name}}, temperature=0) for name, _ in cases]
    with ThreadPoolExecutor(4) as pool:
        messages = pool.map(lambda i: ask(client, cases[i][1], **forced[i]).choices[0].message, range(2))
        streams = pool.map(lambda i: streamed_calls(client, cases[i][1], **forced[i]), range(2))
        for (name, _), message, (names, arguments) in zip(cases, list(messages), list(streams), strict=True):
            assert [n for n, _ in valid_calls(message)] == [name]
            assert names == [name] and arguments == [message.tool_calls[0].function.arguments]


def test_tool_result_round_trip_with_langchain(server):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        return "07:30"

    llm = ChatOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", model="m", temperature=0, max_tokens=48)
    messages = [HumanMessage("What time is it in Oslo?")]
    reply = llm.bind_tools([get_time], tool_choice="get_time").invoke(messages)
    assert [call["name"] for call in reply.tool_calls] == ["get_time"]
    assert isinstance(reply.tool_calls[0]["args"]["city"], str)
    messages += [reply, ToolMessage(get_time.invoke(reply.tool_calls[0]["args"]),
                                    tool_call_id=reply.tool_calls[0]["id"])]
    answer = llm.bind_tools([get_time], tool_choice="none").invoke(messages)
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls
