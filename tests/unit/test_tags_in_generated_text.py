"""Any value a grammar lets through reads back (issue 34, rows 4 and 5): argument strings and JSON answers holding
every markup tag (`</tool_call>`, `</think>`, ...) are split by the grammar's structure, not by the first tag in
the text. Each text here is first checked to be one the compiled grammar accepts, so the parsers are tested on
output the model can really produce."""

from __future__ import annotations

import itertools
import json

import pytest

from radixlm.reasoning import get_reasoning_parser
from radixlm.server.chat_output import OutputParsing, SequenceParser
from radixlm.server.tool_calling import FunctionTool, after_reasoning, tool_call_grammar
from radixlm.structured.grammar_spec import GrammarSpec
from radixlm.tool_parsers import get_tool_parser

TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>", "\n</tool_call>\n", "}", "{",
        '{"name": "f", "arguments": {}}', "; ", "\\"]
ARGUMENT_STRINGS = TAGS + ["".join(pair) for pair in itertools.permutations(TAGS[:5], 2)]
SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
FUNCTIONS = [FunctionTool("f", SCHEMA)]


def accepts(backend, tokenizer, spec: GrammarSpec, text: str) -> bool:
    matcher = backend.new_matcher(backend.compile(spec))
    if not all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False)):
        return False
    return matcher.accept_token(tokenizer.eos_token_id)


def read(parsing: OutputParsing, text: str, step: int) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, calls) of `text` streamed `step` characters at a time, as a client folds them."""
    parser = SequenceParser(parsing)
    reasoning, content, calls = "", "", []
    pieces = [text[i:i + step] for i in range(0, len(text), step)]
    for i, piece in enumerate(pieces):
        for delta in parser.feed(piece, final=i == len(pieces) - 1):
            reasoning += delta.reasoning_content or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.id is not None:
                    calls.append([call.function.name, ""])
                calls[call.index][1] += call.function.arguments or ""
    return reasoning, content, [tuple(call) for call in calls]


def forced_call(parser_name: str, value: str) -> str:
    parser = get_tool_parser(parser_name)
    return parser.call_begin("f") + json.dumps({"x": value}) + parser.call_end


@pytest.mark.parametrize("parser_name", ["hermes", "llama3_json"])
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "auto"])
def test_every_argument_string_round_trips(backend, tokenizer, parser_name, forced):
    grammar = tool_call_grammar(get_tool_parser(parser_name), FUNCTIONS, "f", parallel_tool_calls=False)
    parsing = OutputParsing(tool_parser=get_tool_parser(parser_name), forced_names=("f",) if forced else ())
    for value in ARGUMENT_STRINGS:
        text = forced_call(parser_name, value)
        assert accepts(backend, tokenizer, grammar, text), text
        for step in (1, 3, len(text)):
            reasoning, content, calls = read(parsing, text, step)
            assert content == "" and reasoning == "", (text, step)
            assert [(name, json.loads(arguments)) for name, arguments in calls] == [("f", {"x": value})], text


@pytest.mark.parametrize("value", ARGUMENT_STRINGS)
def test_forced_calls_after_optional_reasoning(backend, tokenizer, value):
    """qwen3: the grammar allows the calls alone or after a think block that opens the output."""
    reasoning_parser = get_reasoning_parser("qwen3").under_grammar()
    forced = tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, "f", parallel_tool_calls=False)
    grammar = after_reasoning(forced, opened_in_prompt=False)
    parsing = OutputParsing(reasoning_parser, get_tool_parser("hermes"), forced_names=("f",))
    call = forced_call("hermes", value)
    for thinking, text in (("", call), ("why", "<think>why</think>" + call)):
        assert accepts(backend, tokenizer, grammar, text), text
        for step in (1, 5, len(text)):
            reasoning, content, calls = read(parsing, text, step)
            assert (reasoning, content) == (thinking, ""), (text, step)
            assert [(n, json.loads(a)) for n, a in calls] == [("f", {"x": value})], (text, step)


@pytest.mark.parametrize("value", ARGUMENT_STRINGS)
@pytest.mark.parametrize("reasoning_name", ["qwen3", "deepseek_r1"])
def test_json_answers_holding_tags_are_content(backend, tokenizer, value, reasoning_name):
    reasoning_parser = get_reasoning_parser(reasoning_name)
    opened = reasoning_parser.unclosed_is_reasoning
    grammar = after_reasoning(GrammarSpec.from_json_schema(SCHEMA), opened_in_prompt=opened)
    answer = json.dumps({"x": value})
    cases = [("r", "r</think>" + answer)] if opened else [("", answer), ("r", "<think>r</think>" + answer)]
    for thinking, text in cases:
        assert accepts(backend, tokenizer, grammar, text), text
        for step in (1, 4, len(text)):
            reasoning, content, calls = read(OutputParsing(reasoning_parser.under_grammar()), text, step)
            assert (reasoning, json.loads(content), calls) == (thinking, {"x": value}, []), (text, step)


def test_free_text_still_splits_at_the_first_end_tag():
    """Without a grammar, qwen3 reads text up to `</think>` as reasoning, wherever it starts."""
    reasoning, content, _ = read(OutputParsing(get_reasoning_parser("qwen3")), "a</think>b", 1)
    assert (reasoning, content) == ("a", "b")
    reasoning, content, _ = read(OutputParsing(get_reasoning_parser("qwen3").under_grammar()), "a</think>b", 1)
    assert (reasoning, content) == ("", "a</think>b")
