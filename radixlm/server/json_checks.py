"""Checks on a parsed JSON body that pydantic's types do not make: valid Unicode text and bounded nesting.

JSON can carry a lone UTF-16 surrogate ("\\ud800"): Python parses it into a str that cannot be encoded as UTF-8,
so no tokenizer, template or response can take it. And `Any` fields (structured-output schemas, extra message
keys handed to the chat template) can nest arbitrarily deep, past the recursion limit of whatever walks them
later. Both are found here in one iterative walk (no recursion of its own) and refused with a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

MAX_NESTING = 100  # far deeper than any real schema or message; RecursionError starts near 1,000
_SCALAR_TYPES = frozenset({int, float, bool, type(None)})


def body_problem(value: Any) -> str | None:
    """What is wrong with one field's parsed value (dict keys included), with where (".key.0..."), or None.
    Numbers are skipped without building their paths, so that a long list of token ids costs little."""
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, str):
            if not _is_utf8(item):
                return f"holds a lone UTF-16 surrogate{_where(path)}, which is not valid Unicode text"
            continue
        if depth >= MAX_NESTING:
            return f"nests deeper than {MAX_NESTING} levels{_where(path)}"
        if isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and not _is_utf8(key):
                    return f"holds a lone UTF-16 surrogate{_where(f'{path}.{key}')}, which is not valid Unicode text"
                if isinstance(child, (str, dict, list)):
                    stack.append((f"{path}.{key}", child, depth + 1))
        elif isinstance(item, list) and not _SCALAR_TYPES.issuperset(map(type, item)):  # (map: C speed)
            stack.extend((f"{path}.{i}", child, depth + 1) for i, child in enumerate(item)
                         if isinstance(child, (str, dict, list)))
    return None


def _where(path: str) -> str:
    readable = path.lstrip(".").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(readable) > 80:
        readable = readable[:80] + "..."
    return f" (at {readable})" if readable else ""


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
