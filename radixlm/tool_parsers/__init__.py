"""Tool-call parsers, named as vLLM names them (`--tool-call-parser`)."""

from __future__ import annotations

from radixlm.tool_parsers.base import ParsedToolCall, ToolCallDelta, ToolParser
from radixlm.tool_parsers.hermes import HermesToolParser
from radixlm.tool_parsers.llama3_json import Llama3JsonToolParser
from radixlm.tool_parsers.stream import ToolCallStream, fold_calls, parse_tool_calls

TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}


def get_tool_parser(name: str) -> ToolParser:
    """The parser called `name`; ValueError lists the known ones."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, got {name!r}")
    return TOOL_PARSERS[name]()


__all__ = ["TOOL_PARSERS", "ParsedToolCall", "ToolCallDelta", "ToolCallStream", "ToolParser", "fold_calls",
           "get_tool_parser", "parse_tool_calls"]
