"""The errors a trace file can raise, the bounds it must keep, and typed readers of one field each.

A reader returns the value when it has the type and range asked for, and raises FieldError naming the field
(`chunks[2][1]`) otherwise. Integers are JSON integers (not booleans, not floats); numbers are finite.
"""

from __future__ import annotations

from typing import Any

# Bounds on what a trace may ask a replay to build. A real trace stays far inside them; a hand-edited one must not
# make `radixlm replay` allocate without limit (a 10**9 n, a 10**12-block KV pool).
MAX_TRACE_BYTES = 128 * 2**20
MAX_LINE_CHARS = 8 * 2**20  # one arrival holds its whole prompt
MAX_EVENTS = 4_000_000
MAX_LINE_DEPTH = 32  # the recorder nests 4 levels deep
MAX_NUM_BLOCKS = 2**21  # the replay's block pool holds a few Python ints per block
MAX_BLOCK_SIZE = 2**12
MAX_MODEL_LEN = 2**24
MAX_NUM_SEQS = 2**20
MAX_BATCHED_TOKENS = 2**24
MAX_SEQUENCES_PER_REQUEST = 1024  # the engine's own limit (--max-sequences-per-request) defaults to 64
MAX_TOTAL_SEQUENCE_TOKENS = 2**26  # prompt tokens summed over every sequence: each one keeps its own copy
MAX_TOKEN_ID = 2**31 - 1
MAX_COUNT = 2**62  # step indices, queue lengths, priorities (magnitude)
MAX_SECONDS = 1e9  # a time since the start of the trace
MAX_ID_CHARS = 1024
MAX_TEXT_CHARS = 65_536  # an error message, a policy name, a speculative config


class TraceError(ValueError):
    """A trace file that cannot be read or replayed: the message is one line naming the file, the line, the event
    and the field (or what the replay found inconsistent there)."""


class FieldError(ValueError):
    """One field of one event is missing or invalid; the loader adds the file, line and event to the message."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name} {problem}")


def shown(value: object) -> str:
    """A short, printable, one-line rendering of a value from the file, for error messages."""
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else ascii(value)
    return text if len(text) <= 64 else f"{text[:60]}..."


def required(event: dict[str, Any], name: str) -> Any:
    if name not in event:
        raise FieldError(name, "is missing")
    return event[name]


def integer(value: object, name: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise FieldError(name, f"must be an integer in [{low}, {high}], got {shown(value)}")
    return value


def number(value: object, name: str, low: float, high: float) -> float:
    """An int or a finite float in [low, high] (the JSON loader already refused NaN and Infinity)."""
    if type(value) not in (int, float) or not low <= value <= high:  # type: ignore[operator]
        raise FieldError(name, f"must be a number in [{low:g}, {high:g}], got {shown(value)}")
    return float(value)  # type: ignore[arg-type]


def optional_number(value: object, name: str, low: float, high: float) -> float | None:
    return None if value is None else number(value, name, low, high)


def text(value: object, name: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str) or len(value) > max_chars:
        raise FieldError(name, f"must be a string of at most {max_chars} characters, got {shown(value)}")
    return value


def optional_text(value: object, name: str, max_chars: int = MAX_TEXT_CHARS) -> str | None:
    return None if value is None else text(value, name, max_chars)


def identifier(value: object, name: str) -> str:
    """A request or sequence id: non-empty, printable (it is printed by `trace show`), bounded."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS or not value.isprintable():
        raise FieldError(name, f"must be a non-empty printable string of at most {MAX_ID_CHARS} characters, "
                               f"got {shown(value)}")
    return value


def flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(name, f"must be true or false, got {shown(value)}")
    return value


def mapping(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FieldError(name, f"must be an object, got {shown(value)}")
    return value


def array(value: object, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise FieldError(name, f"must be a list, got {shown(value)}")
    return value


def token_ids(value: object, name: str, min_items: int, max_items: int) -> list[int]:
    """A list of token ids (integers in [0, MAX_TOKEN_ID]) of a bounded length; a prompt may be long, so the
    common case is checked at C speed and only a bad list is searched for its first bad item."""
    items = array(value, name)
    if not min_items <= len(items) <= max_items:
        raise FieldError(name, f"must hold {min_items} to {max_items} token ids, got {len(items)}")
    if items and (set(map(type, items)) != {int} or min(items) < 0 or max(items) > MAX_TOKEN_ID):
        for index, item in enumerate(items):
            integer(item, f"{name}[{index}]", 0, MAX_TOKEN_ID)
    return items


def record(value: object, name: str, size: int) -> list[Any]:
    """A fixed-size list standing for a tuple, e.g. a chunk [sequence id, start, tokens]."""
    items = array(value, name)
    if len(items) != size:
        raise FieldError(name, f"must be a list of {size} items, got {len(items)}")
    return items
