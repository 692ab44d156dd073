"""`hermes`: calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5/3, our template).

A call ends at the `</tool_call>` after its JSON object, found by the object's structure, so an argument string
may hold any text, `</tool_call>` included: every value a forced call's grammar lets through reads back. Text
that is not a JSON object after `<tool_call>` falls back to the first `</tool_call>`.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.tool_parsers.base import Scan, ToolParser, add_content, held_back
from radixlm.tool_parsers.json_text import ObjectEndFinder, call_from_json

BEGIN = "<tool_call>"
END = "</tool_call>"
_BLANKS = " \t\r\n"


class HermesToolParser(ToolParser):
    name = "hermes"
    call_end = f"}}\n{END}"
    separator = "\n"

    def scan(self, text: str, final: bool, memo: dict[str, Any]) -> Scan:
        scan, pos = Scan(), 0
        while True:
            start = text.find(BEGIN, pos)
            if start == -1:
                end = len(text) if final else len(text) - held_back(text[pos:], BEGIN)
                return add_content(scan, text, pos, end)
            add_content(scan, text, pos, start)
            # A call left open starts the next scan's text: its object's search resumes there (`memo`).
            span = _call_span(text, start + len(BEGIN), final, memo if start == 0 else {})
            if span is None:
                return add_content(scan, text, start, len(text)) if final else scan
            body_end, pos = span
            call = call_from_json(text[start + len(BEGIN):body_end].strip(), ("arguments", "parameters"))
            scan.items.append(call if call is not None else text[start:pos])
            scan.settled = pos

    def call_begin(self, function_name: str) -> str:
        return f'{BEGIN}\n{{"name": {json.dumps(function_name)}, "arguments": '


def _call_span(text: str, body: int, final: bool, memo: dict[str, Any]) -> tuple[int, int] | None:
    """(where the call's body ends, where its `</tool_call>` ends) for the call whose body starts at `body`; None
    while it is open (or, with `final`, when it never closes)."""
    brace = _skip_blanks(text, body)
    if brace == len(text) and not final:
        return None
    if brace < len(text) and text[brace] == "{":
        finder = memo.get("open")
        if finder is None or memo.get("brace") != brace:
            finder = ObjectEndFinder(brace)
            memo.update(open=finder, brace=brace)
        object_end = finder.find(text)
        if object_end is not None:
            after = _skip_blanks(text, object_end)
            if text.startswith(END, after):
                memo.clear()
                return object_end, after + len(END)
            if not final and END.startswith(text[after:]):
                return None  # the end tag may still be arriving
        elif not final:
            return None
    close = text.find(END, body)
    if close == -1:
        return None
    memo.clear()
    return close, close + len(END)


def _skip_blanks(text: str, index: int) -> int:
    while index < len(text) and text[index] in _BLANKS:
        index += 1
    return index
