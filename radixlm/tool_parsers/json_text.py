"""Reading tool-call JSON as the model wrote it: a call object, its arguments' own text, where an object ends."""

from __future__ import annotations

import json
import re

from radixlm.tool_parsers.base import ParsedToolCall


def call_from_json(text: str, arguments_keys: tuple[str, ...]) -> ParsedToolCall | None:
    """A call from `{"name": ..., <arguments key>: {...}}`, or None if `text` is not one. The arguments are the
    model's own text of that object (so that streamed fragments add up to them exactly)."""
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):  # ValueError: also integers too long to convert, NaN and Infinity
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not _is_text(value["name"]):
        return None
    key = next((key for key in arguments_keys if key in value), None)
    if key is None:
        return ParsedToolCall(value["name"], "{}")
    if not isinstance(value[key], dict):
        return None
    start, end = _top_level_spans(text)[key]
    return ParsedToolCall(value["name"], text[start:end])


def _not_json(constant: str) -> None:
    """NaN, Infinity and -Infinity: Python's json reads them, strict JSON parsers (the client's) do not."""
    raise ValueError(f"{constant} is not JSON")


def _is_text(name: str) -> bool:
    """A non-empty name that is valid Unicode: a JSON escape can decode to a lone surrogate, which no response can
    carry (it cannot be encoded as UTF-8)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(name)


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


# A JSON string (group 1 is its closing quote: None while the string is still open) or a bracket; the regex engine
# steps over string contents, so the Python loop sees only structure.
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(")?|[{}\[\]]')


def object_end(text: str, start: int) -> int | None:
    """The index just past the `}` closing the object that opens at `text[start]`, or None if it is still open."""
    return ObjectEndFinder(start).find(text)


class ObjectEndFinder:
    """`object_end`, resumable as the text grows: each call scans only what the previous ones had not."""

    def __init__(self, start: int) -> None:
        self._position = start
        self._depth = 0
        self._end: int | None = None

    def find(self, text: str) -> int | None:
        if self._end is not None:
            return self._end
        for match in _STRUCTURE.finditer(text, self._position):
            token = match.group()
            if token[0] == '"':
                if match.group(1) is None:
                    return None  # an open string: resume at its start
            elif token in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    self._end = match.end()
                    return self._end
            self._position = match.end()
        return None
