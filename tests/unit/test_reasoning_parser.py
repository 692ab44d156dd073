"""Reasoning parsers on canned thinking output, whole and in small deltas, alone and before tool calls."""

import pytest

from radixlm.reasoning import ReasoningStream, get_reasoning_parser
from radixlm.server.chat_output import OutputParsing, parse_message
from radixlm.tool_parsers import get_tool_parser

# (parser, text, reasoning, content)
CASES = [
    ("deepseek_r1", "<think>\nThe user greets me.\n</think>\n\nHello!", "The user greets me.\n", "Hello!"),
    ("deepseek_r1", "The prompt opened the block. </think>Hi", "The prompt opened the block. ", "Hi"),
    ("deepseek_r1", "Still thinking when cut", "Still thinking when cut", None),
    ("deepseek_r1", "<think></think>Answer", None, "Answer"),
    ("qwen3", "<think>\nhmm <b> tags </b>\n</think>\n\n42", "hmm <b> tags </b>\n", "42"),
    ("qwen3", "No thinking at all.", None, "No thinking at all."),
    ("qwen3", "</think>only an end", None, "only an end"),
    ("deepseek_r1", "<think>\n\n\nfirst\n</think>\n\n\nthen", "first\n", "then"),
]


def streamed(name: str, text: str, step: int) -> tuple[str | None, str | None]:
    stream = ReasoningStream(get_reasoning_parser(name))
    pieces = [stream.feed(text[i:i + step]) for i in range(0, len(text), step)] + [stream.feed("", final=True)]
    reasoning, content = "".join(p[0] for p in pieces), "".join(p[1] for p in pieces)
    return reasoning or None, content or None


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_parse_whole(name, text, reasoning, content):
    assert get_reasoning_parser(name).parse(text) == (reasoning, content)


@pytest.mark.parametrize("step", [1, 3, 5])
@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_stream_agrees(name, text, reasoning, content, step):
    assert streamed(name, text, step) == (reasoning, content)


def test_deepseek_streams_reasoning_before_the_end_marker():
    stream = ReasoningStream(get_reasoning_parser("deepseek_r1"))
    assert stream.feed("<think>\nstep one, ") == ("step one, ", "")
    assert stream.feed("step two</th") == ("step two", "")
    assert stream.feed("ink>\n\nanswer") == ("", "answer")


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="reasoning_parser"):
        get_reasoning_parser("nope")


def test_reasoning_then_tool_call():
    parsing = OutputParsing(get_reasoning_parser("deepseek_r1"), get_tool_parser("hermes"))
    text = '<think>I need the weather.</think>\n<tool_call>{"name": "w", "arguments": {"c": 1}}</tool_call>'
    message, _ = parse_message(parsing, text)
    assert message.reasoning_content == "I need the weather." and message.content is None
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [("w", '{"c": 1}')]
