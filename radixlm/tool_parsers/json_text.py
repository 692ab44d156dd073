"""Reading tool-call JSON as the model wrote it: a call object, its arguments' own text, where an object ends."""

from __future__ import annotations

import json

from radixlm.tool_parsers.base import ParsedToolCall


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
