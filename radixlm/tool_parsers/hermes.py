"""`hermes`: calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5/3, our template)."""

from __future__ import annotations

import json
from typing import Any

from radixlm.tool_parsers.base import Scan, ToolParser, add_content, held_back
from radixlm.tool_parsers.json_text import call_from_json

BEGIN = "<tool_call>"
END = "</tool_call>"


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
            close = text.find(END, start + len(BEGIN))
            if close == -1:
                return add_content(scan, text, start, len(text)) if final else scan
            call = call_from_json(text[start + len(BEGIN):close].strip(), ("arguments", "parameters"))
            pos = close + len(END)
            scan.items.append(call if call is not None else text[start:pos])
            scan.settled = pos

    def call_begin(self, function_name: str) -> str:
        return f'{BEGIN}\n{{"name": {json.dumps(function_name)}, "arguments": '
