"""The Messages API on the default model through `radixlm serve` (the session's server: smollm2_tools template,
hermes parser), driven by the official anthropic SDK: a reply, the same reply streamed, and a forced tool use whose
result goes back to the model. (The SDK's `x-api-key` header against a server with a key: test_messages_api.py.)"""

from __future__ import annotations

import anthropic
import jsonschema
import pytest

pytestmark = pytest.mark.slow

WEATHER = {"name": "get_weather", "description": "Weather forecast for a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}
QUESTION = [{"role": "user", "content": "What's the weather in Paris for the next 3 days?"}]
GREEDY = {"temperature": 0}  # the SDK's create() takes no sampling fields: they go as extra_body


@pytest.fixture(scope="module")
def client(default_tool_server):
    return anthropic.Anthropic(base_url=default_tool_server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_reply_and_its_stream_agree(client):
    fields = dict(model="m", max_tokens=24, system="Answer in one short sentence.",
                  messages=[{"role": "user", "content": "What is the capital of France?"}], extra_body=GREEDY)
    message = client.messages.create(**fields)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"
    assert "Paris" in message.content[0].text
    with client.messages.stream(**fields) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message.content[0].text and final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens


def test_forced_tool_use_and_its_result(client):
    reply = client.messages.create(model="m", max_tokens=48, messages=QUESTION, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    calls = [block for block in reply.content if block.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and [call.name for call in calls] == ["get_weather"], reply
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])
    history = [*QUESTION, {"role": "assistant", "content": reply.content}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny, 24 C"}]}]
    answer = client.messages.create(model="m", max_tokens=24, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert answer.content and all(block.type == "text" for block in answer.content), answer
    assert client.messages.count_tokens(model="m", messages=history, tools=[WEATHER]).input_tokens == \
        answer.usage.input_tokens + answer.usage.cache_read_input_tokens
