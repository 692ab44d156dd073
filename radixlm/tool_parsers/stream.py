"""ToolCallStream: a parser's scans turned into content and call deltas; non-streaming parsing is the same stream
fed the whole text at once, so both agree by construction."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radixlm.tool_parsers.base import ParsedToolCall, ToolCallDelta, ToolParser
from radixlm.tool_parsers.json_text import ObjectEndFinder

_FILLER = re.compile(r"[\s;]*")  # what separates calls; never content on its own


class ToolCallStream:
    """Feed one sequence's text deltas; get back content deltas and call deltas, in order.

    A call is emitted when it closes (name, then arguments), since before that it may turn out not to be a call.
    With `forced_names` (the output is constrained to calls of these functions, so every call is well-formed) a
    call streams as it is generated: its name as soon as its opening is complete, then argument fragments.
    Content that is only separators (whitespace, `;`) is held until real content follows, and dropped if none
    does: a reply made only of calls has no content.
    """

    def __init__(self, parser: ToolParser, forced_names: list[str] | None = None) -> None:
        self.parser = parser
        self._begins = {parser.call_begin(name): name for name in forced_names or []}
        self._text = ""
        self._settled = 0
        self._pending_filler = ""
        self._has_content = False
        self._num_calls = 0
        self._memo: dict[str, Any] = {}
        self._open: _OpenCall | None = None

    def feed(self, delta: str, final: bool = False) -> list[str | ToolCallDelta]:
        self._text += delta
        events = self._settle(final=False)
        if self._begins:
            events += self._stream_open_call(self._text[self._settled:])
        if final and self._open is None:  # a forced call cut short stays a (truncated) call, not content
            events += self._settle(final=True)
        if final and self._has_content and self._pending_filler:
            events.append(self._pending_filler)
            self._pending_filler = ""
        return _merged(events)

    def _settle(self, final: bool) -> list[str | ToolCallDelta]:
        scan = self.parser.scan(self._text[self._settled:], final, self._memo)
        self._settled += scan.settled
        events: list[str | ToolCallDelta] = []
        for item in scan.items:
            if isinstance(item, ParsedToolCall):
                events += self._close(item)
            elif _FILLER.fullmatch(item) and not self._has_content:
                self._pending_filler += item
            else:
                events.append(self._pending_filler + item)
                self._pending_filler, self._has_content = "", True
        return events

    def _close(self, call: ParsedToolCall) -> list[ToolCallDelta]:
        if self._open is not None:  # streamed so far: send the rest of its arguments
            index, rest, self._open = self._open.index, call.arguments[self._open.num_emitted:], None
            return [ToolCallDelta(index, None, rest)] if rest else []
        index, self._num_calls = self._num_calls, self._num_calls + 1
        return [ToolCallDelta(index, call.name, ""), ToolCallDelta(index, None, call.arguments)]

    def _stream_open_call(self, tail: str) -> list[ToolCallDelta]:
        events = []
        if self._open is None:
            begin = next((begin for begin in self._begins if tail.startswith(begin)), None)
            if begin is None:
                return []
            self._open = _OpenCall(self._num_calls, len(begin), ObjectEndFinder(len(begin)))
            self._num_calls += 1
            events.append(ToolCallDelta(self._open.index, self._begins[begin], ""))
        call = self._open
        end = call.arguments_end.find(tail) if tail[call.begin_len:call.begin_len + 1] == "{" else None
        arguments = tail[call.begin_len:end]
        if len(arguments) > call.num_emitted:
            events.append(ToolCallDelta(call.index, None, arguments[call.num_emitted:]))
            call.num_emitted = len(arguments)
        return events


@dataclass
class _OpenCall:
    """A forced call being streamed: its index, the length of its opening, where its arguments end, and how many
    argument characters were sent."""

    index: int
    begin_len: int
    arguments_end: ObjectEndFinder
    num_emitted: int = 0


def _merged(events: list[str | ToolCallDelta]) -> list[str | ToolCallDelta]:
    """Adjacent content strings joined into one."""
    merged: list[str | ToolCallDelta] = []
    for event in events:
        if isinstance(event, str) and merged and isinstance(merged[-1], str):
            merged[-1] += event
        elif event != "":
            merged.append(event)
    return merged


def fold_calls(deltas: list[ToolCallDelta]) -> list[ParsedToolCall]:
    """Call deltas joined into whole calls, as a client joins them."""
    names: list[str] = []
    arguments: list[str] = []
    for delta in deltas:
        if delta.name is not None:
            names.append(delta.name)
            arguments.append("")
        arguments[delta.index] += delta.arguments
    return [ParsedToolCall(name, args) for name, args in zip(names, arguments, strict=True)]


def parse_tool_calls(parser: ToolParser, text: str) -> tuple[str | None, list[ParsedToolCall]]:
    """Non-streaming: (content or None, calls) -- exactly what a stream of the same text yields."""
    events = ToolCallStream(parser).feed(text, final=True)
    content = "".join(e for e in events if isinstance(e, str))
    return content or None, fold_calls([e for e in events if isinstance(e, ToolCallDelta)])
