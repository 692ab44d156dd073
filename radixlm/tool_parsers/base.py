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
    """A call from `{"name": ..., <arguments key>: {...}}`, or None if `text` is not one."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = next((value[key] for key in arguments_keys if key in value), {})
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


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


class ToolParser(ABC):
    """One model family's tool-call format. Subclasses are stateless; `name` is the `--tool-call-parser` value."""

    name: str = ""
    separator: str = "\n"  # between parallel calls, in the constrained format

    @abstractmethod
    def scan(self, text: str, final: bool) -> Scan:
        """Settle as much of `text` as is certain. With `final`, everything is settled: an unclosed or malformed
        call is content. The stream scans only the unsettled tail, so a scan must depend on its input alone."""

    @abstractmethod
    def call_tag(self, function_name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """The xgrammar tag that produces one call of `function_name` in this format."""


class ToolCallStream:
    """Feed one sequence's text deltas; get back content deltas and complete calls, in order.

    Content that is only separators (whitespace, `;`) is held until real content follows, and dropped if none
    does: a reply made only of calls has no content.
    """

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self._text = ""
        self._settled = 0
        self._pending_filler = ""
        self._has_content = False

    def feed(self, delta: str, final: bool = False) -> list[str | ParsedToolCall]:
        self._text += delta
        scan = self.parser.scan(self._text[self._settled:], final)
        self._settled += scan.settled
        events: list[str | ParsedToolCall] = []
        for item in scan.items:
            if isinstance(item, ParsedToolCall):
                events.append(item)
            elif _FILLER.fullmatch(item) and not self._has_content:
                self._pending_filler += item
            else:
                events.append(self._pending_filler + item)
                self._pending_filler, self._has_content = "", True
        if final and self._has_content and self._pending_filler:
            events.append(self._pending_filler)
            self._pending_filler = ""
        return _merged(events)


def _merged(events: list[str | ParsedToolCall]) -> list[str | ParsedToolCall]:
    """Adjacent content strings joined into one."""
    merged: list[str | ParsedToolCall] = []
    for event in events:
        if isinstance(event, str) and merged and isinstance(merged[-1], str):
            merged[-1] += event
        elif event != "":
            merged.append(event)
    return merged


def parse_tool_calls(parser: ToolParser, text: str) -> tuple[str | None, list[ParsedToolCall]]:
    """Non-streaming: (content or None, calls) -- exactly what a stream of the same text yields."""
    events = ToolCallStream(parser).feed(text, final=True)
    content = "".join(e for e in events if isinstance(e, str))
    return content or None, [e for e in events if isinstance(e, ParsedToolCall)]
