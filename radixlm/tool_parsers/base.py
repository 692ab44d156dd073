"""The tool-parser contract: a parser scans a model's text into content and tool calls (`stream.py` streams it).

A parser only has to say how its format scans (`ToolParser.scan`): which leading part of the text is settled into
content pieces and complete calls, and which tail is still open (a marker that may be starting, a call not yet
closed). `ToolCallStream` turns that into deltas, and the non-streaming result is the same stream fed the whole
text at once, so streaming and non-streaming agree by construction. The same parser also describes its format as
an xgrammar tag (`call_tag`), so that `tool_choice="required"` or a named function constrains the model to text
this parser reads back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


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
    def scan(self, text: str, final: bool, memo: dict[str, Any]) -> Scan:
        """Settle as much of `text` as is certain. With `final`, everything is settled: an unclosed or malformed
        call is content. The stream scans only the unsettled tail, so a scan must depend on its input alone; `memo`
        (one per stream) may carry work on the open tail over to the next scan, so that streaming stays linear."""

    @abstractmethod
    def call_begin(self, function_name: str) -> str:
        """The text of a call up to its arguments object, in the form constrained calls take."""

    def call_tag(self, function_name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """The xgrammar tag that produces one call of `function_name` in this format."""
        return {"type": "tag", "begin": self.call_begin(function_name),
                "content": {"type": "json_schema", "json_schema": parameters}, "end": self.call_end}
