"""`llama3_json`: calls as JSON objects `{"name": ..., "parameters": {...}}`, several joined by `; ` (Llama 3.x's
JSON tool format). An object that is not a call stays content."""

from __future__ import annotations

import json
from typing import Any

from radixlm.tool_parsers.base import Scan, ToolParser, add_content, call_from_json


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


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    separator = "; "

    def scan(self, text: str, final: bool) -> Scan:
        scan, pos = Scan(), 0
        while True:
            start = text.find("{", pos)
            if start == -1:
                add_content(scan, text, pos, len(text))
                return scan
            add_content(scan, text, pos, start)
            end = object_end(text, start)
            if end is None:
                return add_content(scan, text, start, len(text)) if final else scan
            call = call_from_json(text[start:end], ("parameters", "arguments"))
            scan.items.append(call if call is not None else text[start:end])
            scan.settled = pos = end

    def call_tag(self, function_name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(function_name)}, "parameters": ',
                "content": {"type": "json_schema", "json_schema": parameters}, "end": "}"}

