"""JSON text from a source that may be hostile (a hand-edited trace line, a value typed at `radixlm debug`), parsed
within bounds.

`json.loads` alone accepts NaN and Infinity (and reads 1e999 as inf), decodes "\\ud800" into a lone surrogate that
no UTF-8 stream can print, and recurses once per nesting level, so deeply nested text raises RecursionError instead
of a parse error. `loads_bounded` refuses all of these with a ValueError saying what is wrong.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# The characters that change the nesting depth or the string state; everything else is skipped at C speed.
_STRUCTURE = re.compile(r'[\[\]{}"\\]')
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def exceeds_depth(text: str, max_depth: int) -> bool:
    """Whether JSON `text` opens more than `max_depth` arrays/objects inside each other (brackets in strings do not
    count). Linear in the number of brackets, quotes and backslashes; never recursive."""
    if text.count("[") + text.count("{") <= max_depth:
        return False  # too few openings to nest that deep: the common case costs two C-level scans
    depth, in_string, skip_until = 0, False, -1
    for match in _STRUCTURE.finditer(text):
        position, char = match.start(), match.group()
        if position < skip_until:
            continue  # the character after a backslash in a string
        if in_string:
            if char == "\\":
                skip_until = position + 2
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]}{'...' if len(text) > 24 else ''} is out of range")
    return value


def _holds_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) in a parsed JSON value holds a surrogate code point: JSON pairs escaped
    surrogates into one character, so any left is alone. Iterative: the depth is already bounded, but cheap so."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def loads_bounded(text: str, max_depth: int) -> Any:
    """`json.loads(text)` for untrusted text: raises ValueError (never RecursionError) when the text is not JSON,
    nests deeper than `max_depth`, holds NaN / Infinity or a number beyond float range, or holds a lone surrogate
    (raw in the text, or as a \\u escape)."""
    if _SURROGATE.search(text):
        raise ValueError("holds a lone surrogate (text that is not valid Unicode)")
    if exceeds_depth(text, max_depth):
        raise ValueError(f"is nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as error:
        raise ValueError(f"is not valid JSON: {error.msg} (column {error.colno})") from None
    except RecursionError:  # only if the caller's own stack is already deep: the depth was checked above
        raise ValueError("is nested too deeply") from None
    except ValueError as error:  # a refused constant or float, or an integer of more digits than Python converts
        raise ValueError(f"is not valid JSON: {error}") from None
    if _ESCAPED_SURROGATE.search(text) and _holds_lone_surrogate(value):
        raise ValueError("holds a lone surrogate (a \\ud800-\\udfff escape that is not half of a pair)")
    return value
