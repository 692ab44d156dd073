"""One sequence's generated text -> reasoning, content and tool calls, as stream deltas or as a whole message.

The reasoning parser splits `<think>` text off first; the tool parser reads the content after it. A whole message
is the stream of the same text fed at once and merged, so streaming and non-streaming replies agree by
construction (only the random call ids differ).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from radixlm.reasoning import ReasoningParser, ReasoningStream
from radixlm.server.response_bodies import (
    AssistantMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from radixlm.tool_parsers import ToolCallDelta, ToolCallStream, ToolParser


@dataclass(frozen=True)
class OutputParsing:
    """How a request's output is read: `tool_parser` is None when calls are not parsed (no tools, or "none");
    `single_call` keeps only the first call (`parallel_tool_calls: false`); `forced_names` lists the functions the
    grammar forces calls of (their calls stream argument fragments as they are generated); `named_choice`: the
    request's tool_choice named one function."""

    reasoning: ReasoningParser | None = None
    tool_parser: ToolParser | None = None
    single_call: bool = False
    forced_names: tuple[str, ...] = ()
    named_choice: bool = False


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class SequenceParser:
    """The streaming state of one sequence: `feed` each text delta (`final` with the last one)."""

    def __init__(self, parsing: OutputParsing) -> None:
        self.parsing = parsing
        self._reasoning = ReasoningStream(parsing.reasoning) if parsing.reasoning is not None else None
        self._tools = ToolCallStream(parsing.tool_parser, list(parsing.forced_names)) \
            if parsing.tool_parser is not None else None
        self.num_calls = 0

    def feed(self, delta: str, final: bool = False) -> list[DeltaMessage]:
        reasoning, content = self._reasoning.feed(delta, final) if self._reasoning else ("", delta)
        deltas = [DeltaMessage(reasoning_content=reasoning)] if reasoning else []
        events = self._tools.feed(content, final) if self._tools else [content] if content else []
        for event in events:
            if isinstance(event, str):
                deltas.append(DeltaMessage(content=event))
            elif not (self.parsing.single_call and event.index > 0):
                deltas.append(DeltaMessage(tool_calls=[self._call_delta(event)]))
        return deltas

    def finish_reason(self, finish_reason: str | None) -> str | None:
        """A reply that called tools and stopped by itself ends with "tool_calls", as OpenAI's do; under a named
        tool_choice OpenAI (and vLLM) say "stop"."""
        if self.num_calls and finish_reason == "stop" and not self.parsing.named_choice:
            return "tool_calls"
        return finish_reason

    def _call_delta(self, delta: ToolCallDelta) -> DeltaToolCall:
        """A call's first delta carries its new id, type and name, as OpenAI streams a call."""
        if delta.name is None:
            return DeltaToolCall(index=delta.index, function=DeltaFunctionCall(arguments=delta.arguments))
        self.num_calls += 1
        return DeltaToolCall(index=delta.index, id=new_call_id(), type="function",
                             function=DeltaFunctionCall(name=delta.name, arguments=delta.arguments))


def parse_message(parsing: OutputParsing, text: str) -> tuple[AssistantMessage, SequenceParser]:
    """The whole reply as one message (and the parser, for `finish_reason`)."""
    parser = SequenceParser(parsing)
    reasoning, content, calls = [], [], []
    for delta in parser.feed(text, final=True):
        reasoning.append(delta.reasoning_content or "")
        content.append(delta.content or "")
        for call in delta.tool_calls or []:
            if call.id is not None:
                calls.append(ToolCall(id=call.id, function=FunctionCall(name=call.function.name or "",
                                                                        arguments=call.function.arguments or "")))
            else:
                calls[call.index].function.arguments += call.function.arguments or ""
    text_content = "".join(content)
    return AssistantMessage(content=text_content or (None if calls else ""), reasoning_content="".join(reasoning)
                            or None, tool_calls=calls or None), parser
