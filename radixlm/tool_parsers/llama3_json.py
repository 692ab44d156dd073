"""`llama3_json`: calls as JSON objects `{"name": ..., "parameters": {...}}`, several joined by `; ` (Llama 3.x's
JSON tool format). An object that is not a call stays content."""

from __future__ import annotations

import json
from typing import Any

from radixlm.tool_parsers.base import Scan, ToolParser, add_content
from radixlm.tool_parsers.json_text import ObjectEndFinder, call_from_json


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    call_end = "}"
    separator = "; "

    def scan(self, text: str, final: bool, memo: dict[str, Any]) -> Scan:
        scan, pos = Scan(), 0
        while True:
            start = text.find("{", pos)
            if start == -1:
                add_content(scan, text, pos, len(text))
                return scan
            add_content(scan, text, pos, start)
            # An object left open starts the next scan's text: resume its search there.
            finder = memo.pop("open", None) if start == 0 else None
            finder = finder or ObjectEndFinder(0)
            relative_end = finder.find(text[start:])
            if relative_end is None:
                memo["open"] = finder
                return add_content(scan, text, start, len(text)) if final else scan
            end = start + relative_end
            call = call_from_json(text[start:end], ("parameters", "arguments"))
            scan.items.append(call if call is not None else text[start:end])
            scan.settled = pos = end

    def call_begin(self, function_name: str) -> str:
        return f'{{"name": {json.dumps(function_name)}, "parameters": '
