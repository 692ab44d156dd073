"""Grammars for forced tool choices and for structured output after reasoning, compiled by the xgrammar backend:
the text the tool parser reads back is accepted, anything else is not."""

import pytest

from radixlm.server.tool_calling import FunctionTool, after_reasoning, tool_call_grammar
from radixlm.structured.grammar_spec import GrammarSpec
from radixlm.tool_parsers import get_tool_parser

POINT = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
FUNCTIONS = [FunctionTool("move", POINT), FunctionTool("stop", {"type": "object", "properties": {}})]


def accepts(backend, tokenizer, spec: GrammarSpec, text: str) -> bool:
    """Whether the whole of `text` is accepted and the grammar may end there."""
    matcher = backend.new_matcher(backend.compile(spec))
    if not all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False)):
        return False
    return matcher.accept_token(tokenizer.eos_token_id)


MOVE = '<tool_call>\n{"name": "move", "arguments": {"x": 3}}\n</tool_call>'
STOP = '<tool_call>\n{"name": "stop", "arguments": {}}\n</tool_call>'


def test_required_accepts_one_or_more_calls_in_the_parsers_format(backend, tokenizer):
    spec = tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, "required", parallel_tool_calls=True)
    assert accepts(backend, tokenizer, spec, MOVE)
    assert accepts(backend, tokenizer, spec, MOVE + "\n" + STOP)
    assert not accepts(backend, tokenizer, spec, "")
    assert not accepts(backend, tokenizer, spec, '<tool_call>\n{"name": "move", "arguments": {"x": "a"}}\n</tool_call>')
    assert not accepts(backend, tokenizer, spec, '<tool_call>\n{"name": "jump", "arguments": {}}\n</tool_call>')
    assert not accepts(backend, tokenizer, spec, 'hi ' + MOVE)


def test_a_call_may_end_its_line_and_stop(backend, tokenizer):
    # The model's natural newline after </tool_call> used to be read as the separator, forcing another call.
    for choice, parallel in (("required", True), ("required", False), ("move", True)):
        spec = tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, choice, parallel_tool_calls=parallel)
        assert accepts(backend, tokenizer, spec, MOVE + "\n"), choice
        assert accepts(backend, tokenizer, spec, MOVE + "\n\n"), choice
        assert not accepts(backend, tokenizer, spec, MOVE + "\n" * 5), choice  # bounded: the end comes soon


def test_named_and_single_choices_allow_one_call(backend, tokenizer):
    named = tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, "stop", parallel_tool_calls=True)
    assert accepts(backend, tokenizer, named, STOP) and not accepts(backend, tokenizer, named, MOVE)
    single = tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, "required", parallel_tool_calls=False)
    assert not accepts(backend, tokenizer, single, MOVE + "\n" + STOP)


def test_llama3_json_format(backend, tokenizer):
    spec = tool_call_grammar(get_tool_parser("llama3_json"), FUNCTIONS, "required", parallel_tool_calls=True)
    assert accepts(backend, tokenizer, spec, '{"name": "move", "parameters": {"x": 3}}; {"name": "stop", '
                                             '"parameters": {}}')


def test_no_free_whitespace_inside_arguments(backend, tokenizer):
    spec = tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, "move", parallel_tool_calls=True)
    assert not accepts(backend, tokenizer, spec, MOVE.replace('{"x": 3}', '{"x" :  3}'))


def test_none_and_auto_are_not_constrained():
    assert tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, "auto", True) is None
    assert tool_call_grammar(get_tool_parser("hermes"), FUNCTIONS, "none", True) is None


@pytest.mark.parametrize(("spec", "answer"), [(GrammarSpec.from_json_schema(POINT), '{"x": 3}'),
                                              (GrammarSpec.json_object(), '{"a": 1}'),
                                              (GrammarSpec.from_regex("[a-c]{2}"), "ab"),
                                              (GrammarSpec.from_choice(["yes", "no"]), "no"),
                                              (GrammarSpec.from_ebnf('root ::= "x" [0-9]'), "x7")])
def test_structured_output_applies_after_reasoning(backend, tokenizer, spec, answer):
    opened = after_reasoning(spec, opened_in_prompt=True)  # deepseek_r1: the output starts inside the think block
    assert accepts(backend, tokenizer, opened, "free text, even {not json}</think>" + answer)
    assert not accepts(backend, tokenizer, opened, answer)  # the reasoning must end first
    assert not accepts(backend, tokenizer, opened, "thinking</think>" + answer + "!")
    optional = after_reasoning(spec, opened_in_prompt=False)  # qwen3: text without </think> is the answer
    assert accepts(backend, tokenizer, optional, answer)
    assert accepts(backend, tokenizer, optional, "<think>free text, even {not json}</think>" + answer)
    assert not accepts(backend, tokenizer, optional, "free text " + answer)  # the answer is never left free
    assert not accepts(backend, tokenizer, optional, "<think>thinking</think>" + answer + "!")


def test_bad_structural_tag_is_a_value_error(backend):
    spec = GrammarSpec.from_structural_tag({"type": "structural_tag", "format": {"type": "no_such_format"}})
    with pytest.raises(ValueError, match="structural_tag"):
        backend.compile(spec)
    with pytest.raises(ValueError, match="structural_tag"):
        GrammarSpec.from_structural_tag({"format": {}})
