"""A chat request's `tools` and `tool_choice`: validated, and turned into a grammar when the choice is forced.

`required` and a named function are constrained: the output must be one or more calls (one, if the choice is named
or `parallel_tool_calls` is false) in the tool parser's own format, each call's arguments matching its function's
JSON schema, so the parser always reads them back. `auto` is not constrained: the parser reads whatever the model
writes, and text that is not a call stays content. Every error message starts with the field it is about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radixlm.errors import ParamError
from radixlm.reasoning import THINK_END, THINK_START
from radixlm.structured.grammar_spec import GrammarSpec
from radixlm.tool_parsers import ToolParser

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI's rule for function names
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    name: str
    parameters: dict[str, Any]


def check_tools(tools: Any) -> list[FunctionTool]:
    """The request's function tools; ValueError (naming `tools...`) for anything else."""
    if not isinstance(tools, list) or not tools:
        raise ParamError("tools", "must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    if len(tools) > MAX_TOOLS:
        raise ParamError("tools", f"holds {len(tools)} tools; at most {MAX_TOOLS} are allowed")
    functions, names = [], set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ParamError(f"tools.{i}", "must be {\"type\": \"function\", \"function\": {\"name\", ...}}")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ParamError(f"tools.{i}.function.name", "must be 1-64 letters, digits, '_', '.' or '-'")
        if name in names:
            raise ParamError(f"tools.{i}.function.name", f"{name!r} is given twice")
        parameters = function.get("parameters", _EMPTY_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ParamError(f"tools.{i}.function.parameters", "must be a JSON schema object")
        names.add(name)
        functions.append(FunctionTool(name, parameters or _EMPTY_PARAMETERS))
    return functions


def check_tool_choice(tool_choice: Any, functions: list[FunctionTool]) -> str:
    """"none", "auto", "required", or the name of the function the request forces."""
    if tool_choice is None or (tool_choice == "none" and not functions):
        return "auto" if functions else "none"
    if not functions:
        raise ParamError("tool_choice", "needs tools")
    if tool_choice in ("none", "auto", "required"):
        return tool_choice
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice_type(tool_choice) != "function" or not isinstance(name, str):
        raise ParamError('tool_choice', 'must be "none", "auto", "required" or {"type": "function", "function": '
                         '{"name": ...}}')
    if name not in {f.name for f in functions}:
        raise ParamError("tool_choice", f"names the function {name[:64]!r}, which is not in tools")
    return name


def tool_choice_type(tool_choice: Any) -> Any:
    return tool_choice.get("type") if isinstance(tool_choice, dict) else None


def tool_call_grammar(parser: ToolParser, functions: list[FunctionTool], choice: str,
                      parallel_tool_calls: bool) -> GrammarSpec | None:
    """The constraint for a forced choice (`required` or a function's name); None for `auto` and `none`."""
    if choice in ("none", "auto"):
        return None
    chosen = functions if choice == "required" else [f for f in functions if f.name == choice]
    tags = [parser.call_tag(f.name, f.parameters) for f in chosen]
    single = choice != "required" or not parallel_tool_calls
    calls = {"type": "tags_with_separator", "tags": tags, "separator": parser.separator, "at_least_one": True,
             "stop_after_first": single}
    # Models end a call's line, often with a blank line after it: without room for that whitespace the grammar
    # reads the newline as the separator and forces a second call (and a third...) until max_tokens. Bounded, so
    # that the end (EOS) is forced soon after.
    trailing_space = {"type": "regex", "pattern": r"[ \n]{0,4}"}  # not \s: xgrammar counts \ufeff and \x0c in it
    return GrammarSpec.from_structural_tag({"type": "structural_tag", "format": {
        "type": "sequence", "elements": [calls, trailing_space]}})


def after_reasoning(spec: GrammarSpec, opened_in_prompt: bool) -> GrammarSpec:
    """`spec` applied only to the text after the reasoning: the reasoning before `</think>` is free.

    `opened_in_prompt` (deepseek_r1): the template opens the think block, so the output starts inside it and must
    close it. Otherwise (qwen3) text without `</think>` is the answer, so the output is either the answer itself or
    a `<think>...</think>` block and then the answer: either way the answer is constrained."""
    answer = spec.as_format()
    if opened_in_prompt:
        thinking = {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": THINK_END}
        return GrammarSpec.from_structural_tag({"type": "structural_tag", "format": {
            "type": "sequence", "elements": [thinking, answer]}})
    thinking = {"type": "tag", "begin": THINK_START, "content": {"type": "any_text"}, "end": THINK_END}
    return GrammarSpec.from_structural_tag({"type": "structural_tag", "format": {
        "type": "or", "elements": [answer, {"type": "sequence", "elements": [thinking, answer]}]}})
