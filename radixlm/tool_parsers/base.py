"""The tool-parser contract: split a model's text into content and tool calls, streaming or not.

A parser only has to say how its format scans (`ToolParser.scan`): which leading part of the text is settled into
content pieces and complete calls, and which tail is still open (a marker that may be starting, a call not yet
closed). `ToolCallStream` turns that into deltas, and the non-streaming result is the same stream fed the whole
text at once, so streaming and non-streaming agree by construction. The same parser also describes its format as
an xgrammar tag (`call_tag`), so that `tool_choice="required"` or a named function constrains the model to text
this parser reads back.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

_FILLER = re.compile(r"[\s;]*")  # what separates calls; never content on its own


@dataclass(frozen=True)
class ParsedToolCall:
    """One call: the function's name and its arguments as JSON text (an object)."""

    name: str
    arguments: str


@dataclass
class Scan:
    """`items` (content strings and calls, in order) cover `text[:settled]`; the rest is still open."""

    items: list[str | ParsedToolCall] = field(default_factory=list)
    settled: int = 0


def call_from_json(text: str, arguments_keys: tuple[str, ...]) -> ParsedToolCall | None:
    """A call from `{"name": ..., <arguments key>: {...}}`, or None if `text` is not one. The arguments are the
    model's own text of that object (so that streamed fragments add up to them exactly)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    key = next((key for key in arguments_keys if key in value), None)
    if key is None:
        return ParsedToolCall(value["name"], "{}")
    if not isinstance(value[key], dict):
        return None
    start, end = _top_level_spans(text)[key]
    return ParsedToolCall(value["name"], text[start:end])


def _top_level_spans(text: str) -> dict[str, tuple[int, int]]:
    """Where each top-level value of a JSON object (already known to be valid) lies in `text` (the last of a
    repeated key, as json.loads keeps it)."""
    decoder, spans = json.JSONDecoder(), {}
    index = text.index("{") + 1
    while True:
        index = _skip_blanks(text, index)
        if text[index] == "}":
            return spans
        key, index = decoder.raw_decode(text, index)
        index = _skip_blanks(text, _skip_blanks(text, index) + 1)  # past the ':'
        _, end = decoder.raw_decode(text, index)
        spans[key] = (index, end)
        index = _skip_blanks(text, end)
        index += text[index] == ","


def _skip_blanks(text: str, index: int) -> int:
    while text[index] in " \t\n\r":
        index += 1
    return index


def object_end(text: str, start: int) -> int | None:
    """The index just past the `}` closing the object that opens at `text[start]`, or None if it is still open."""
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def add_content(scan: Scan, text: str, start: int, end: int) -> Scan:
    """Settle `text[start:end]` as content (nothing if empty)."""
    if end > start:
        scan.items.append(text[start:end])
        scan.settled = end
    return scan


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker` (kept until the next delta)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@dataclass(frozen=True)
class ToolCallDelta:
    """Part of the `index`-th call: its first delta names it (`arguments` ""), later ones add argument text."""

    index: int
    name: str | None
    arguments: str


class ToolParser(ABC):
    """One model family's tool-call format. Subclasses are stateless; `name` is the `--tool-call-parser` value."""

    name: str = ""
    separator: str = "\n"  # between parallel calls, in the constrained format
    call_end: str = ""  # what closes a call after its arguments object

    @abstractmethod
    def scan(self, text: str, final: bool) -> Scan:
        """Settle as much of `text` as is certain. With `final`, everything is settled: an unclosed or malformed
        call is content. The stream scans only the unsettled tail, so a scan must depend on its input alone."""

    @abstractmethod
    def call_begin(self, function_name: str) -> str:
        """The text of a call up to its arguments object, in the form constrained calls take."""

    def call_tag(self, function_name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """The xgrammar tag that produces one call of `function_name` in this format."""
        return {"type": "tag", "begin": self.call_begin(function_name),
                "content": {"type": "json_schema", "json_schema": parameters}, "end": self.call_end}


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
        self._open: list[int] | None = None  # the streaming call: [index, length of its opening, chars emitted]

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
        scan = self.parser.scan(self._text[self._settled:], final)
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
            (index, _, emitted), self._open = self._open, None
            return [ToolCallDelta(index, None, call.arguments[emitted:])] if call.arguments[emitted:] else []
        index, self._num_calls = self._num_calls, self._num_calls + 1
        return [ToolCallDelta(index, call.name, ""), ToolCallDelta(index, None, call.arguments)]

    def _stream_open_call(self, tail: str) -> list[ToolCallDelta]:
        events = []
        if self._open is None:
            begin = next((begin for begin in self._begins if tail.startswith(begin)), None)
            if begin is None:
                return []
            self._open = [self._num_calls, len(begin), 0]
            self._num_calls += 1
            events.append(ToolCallDelta(self._open[0], self._begins[begin], ""))
        index, begin_len, emitted = self._open
        value = tail[begin_len:]
        end = object_end(value, 0) if value.startswith("{") else None
        arguments = value[:end] if end is not None else value
        if len(arguments) > emitted:
            events.append(ToolCallDelta(index, None, arguments[emitted:]))
            self._open[2] = len(arguments)
        return events


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
