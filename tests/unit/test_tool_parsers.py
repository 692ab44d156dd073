"""Tool-call parsers on canned model outputs: one call, several, calls mixed with text, malformed JSON; the whole
text at once and the same text split into many small deltas must give the same content and calls."""

import json

import pytest

from radixlm.server.chat_output import OutputParsing, SequenceParser, parse_message
from radixlm.tool_parsers import (
    ParsedToolCall,
    ToolCallDelta,
    ToolCallStream,
    fold_calls,
    get_tool_parser,
    parse_tool_calls,
)

WEATHER = ParsedToolCall("get_weather", '{"city": "Paris", "days": [1, 2]}')
TIME = ParsedToolCall("get_time", '{"zone": "a}b{\\"c"}')

# (parser, text, expected content, expected calls)
CASES = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>',
     None, [WEATHER]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"zone": "a}b{\\"c"}}\n</tool_call>', None,
     [WEATHER, TIME]),
    ("hermes", 'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
               '</tool_call> Done.', "Let me check.\n Done.", [WEATHER]),
    ("hermes", 'Oops <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> end',
     'Oops <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> end', []),
    ("hermes", 'Unclosed <tool_call>{"name": "x", "arguments": {}}',
     'Unclosed <tool_call>{"name": "x", "arguments": {}}', []),
    ("hermes", "plain text with <tool and < signs", "plain text with <tool and < signs", []),
    ("hermes", '<tool_call>{"name": "f"}</tool_call>', None, [ParsedToolCall("f", "{}")]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}', None, [WEATHER]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}; '
                    '{"name": "get_time", "parameters": {"zone": "a}b{\\"c"}}', None, [WEATHER, TIME]),
    ("llama3_json", 'Sure: {"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}} ok',
     "Sure:  ok", [WEATHER]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par', '{"name": "get_weather", "parameters": '
                                                                          '{"city": "Par', []),
    ("llama3_json", '{"name": 3, "parameters": {}} and {"a": 1}', '{"name": 3, "parameters": {}} and {"a": 1}', []),
    ("llama3_json", "no calls here", "no calls here", []),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": ' + "9" * 5000 + '}}</tool_call>',
     '<tool_call>{"name": "f", "arguments": {"a": ' + "9" * 5000 + '}}</tool_call>', []),
    ("llama3_json", '{"name": "f", "parameters": ' + "[" * 5000 + "]" * 5000 + "}",
     '{"name": "f", "parameters": ' + "[" * 5000 + "]" * 5000 + "}", []),
    # a name that decodes to a lone surrogate (no response can carry it), arguments strict JSON parsers refuse:
    # malformed calls, kept as text
    ("hermes", '<tool_call>{"name": "get\\ud83d", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "get\\ud83d", "arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": NaN, "b": Infinity}}</tool_call>',
     '<tool_call>{"name": "f", "arguments": {"a": NaN, "b": Infinity}}</tool_call>', []),
    ("llama3_json", '{"name": "f", "parameters": {"a": -Infinity}}', '{"name": "f", "parameters": {"a": -Infinity}}',
     []),
]


def stream_all(parser_name: str, text: str, step: int, forced_names: list[str] | None = None,
               ) -> tuple[str | None, list[ParsedToolCall]]:
    stream = ToolCallStream(get_tool_parser(parser_name), forced_names)
    events = []
    for start in range(0, len(text), step):
        events += stream.feed(text[start:start + step])
    events += stream.feed("", final=True)
    content = "".join(e for e in events if isinstance(e, str))
    return content or None, fold_calls([e for e in events if isinstance(e, ToolCallDelta)])


@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), CASES)
def test_parse_whole_text(parser_name, text, content, calls):
    assert parse_tool_calls(get_tool_parser(parser_name), text) == (content, calls)


@pytest.mark.parametrize("step", [1, 2, 3, 7])
@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), CASES)
def test_stream_in_small_deltas_agrees(parser_name, text, content, calls, step):
    assert stream_all(parser_name, text, step) == (content, calls)


def test_content_streams_before_the_call_completes():
    stream = ToolCallStream(get_tool_parser("hermes"))
    assert stream.feed("Checking the weather ") == ["Checking the weather "]
    assert stream.feed("<tool_") == []  # may be a marker: held
    assert stream.feed('call>{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}') == []
    assert stream.feed("</tool_call>") == [ToolCallDelta(0, "get_weather", ""),
                                           ToolCallDelta(0, None, '{"city": "Paris", "days": [1, 2]}')]


FORCED = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {"zone": "a}b{\\"c"}}\n</tool_call>')


@pytest.mark.parametrize("step", [1, 4])
def test_forced_calls_stream_argument_fragments_as_generated(step):
    stream = ToolCallStream(get_tool_parser("hermes"), ["get_weather", "get_time"])
    events = [e for i in range(0, len(FORCED), step) for e in stream.feed(FORCED[i:i + step])]
    events += stream.feed("", final=True)
    assert events[0] == ToolCallDelta(0, "get_weather", "")
    fragments = [e.arguments for e in events if isinstance(e, ToolCallDelta) and e.index == 0 and e.name is None]
    assert len(fragments) > 3 and "".join(fragments) == WEATHER.arguments
    assert fold_calls(events) == [WEATHER, TIME] == parse_tool_calls(get_tool_parser("hermes"), FORCED)[1]


def test_a_forced_call_cut_short_stays_a_call():
    cut = FORCED[:FORCED.index("Paris") + 2]
    assert stream_all("hermes", cut, 3, ["get_weather"]) == \
        (None, [ParsedToolCall("get_weather", '{"city": "Pa')])
    message, _ = parse_message(OutputParsing(tool_parser=get_tool_parser("hermes"), forced_names=("get_weather",)),
                               cut)
    assert message.tool_calls[0].function.arguments == '{"city": "Pa' and message.content is None


def test_stream_deltas_name_first_then_arguments():
    parser = SequenceParser(OutputParsing(tool_parser=get_tool_parser("hermes")))
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    deltas = [d for i in range(len(text)) for d in parser.feed(text[i], final=i == len(text) - 1)]
    wire = [d.model_dump(mode="json") for d in deltas]
    assert wire[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert wire[0]["tool_calls"][0]["id"].startswith("call_") and wire[0]["tool_calls"][0]["type"] == "function"
    assert wire[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}
    assert parser.finish_reason("stop") == "tool_calls" and parser.finish_reason("length") == "length"


def test_message_holds_calls_and_null_content():
    parsing = OutputParsing(tool_parser=get_tool_parser("llama3_json"))
    message, _ = parse_message(parsing, TIME_TEXT)
    body = message.model_dump(mode="json")
    assert body["content"] is None and "reasoning_content" not in body
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in body["tool_calls"]] == \
        [("get_time", {"zone": 'a}b{"c'})]


def test_single_call_keeps_the_first():
    parsing = OutputParsing(tool_parser=get_tool_parser("llama3_json"), single_call=True)
    message, parser = parse_message(parsing, TIME_TEXT + "; " + TIME_TEXT)
    assert len(message.tool_calls or []) == 1 and parser.num_calls == 1


def test_no_tool_parser_leaves_text_alone():
    message, parser = parse_message(OutputParsing(), TIME_TEXT)
    assert message.content == TIME_TEXT and message.tool_calls is None and parser.finish_reason("stop") == "stop"


TIME_TEXT = '{"name": "get_time", "parameters": {"zone": "a}b{\\"c"}}'
