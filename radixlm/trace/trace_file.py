"""Reading a step trace file as hostile input: bounded, decoded, parsed and validated before anything runs.

`load_trace_file(path)` reads at most MAX_TRACE_BYTES, decodes strict UTF-8, parses each line with
`bounded_json.loads_bounded` (no NaN / Infinity, no lone surrogates, bounded nesting), checks every event's fields
(`trace_schema.py`) and the references between events (`trace_refs.py`). The first problem raises TraceError, a
ValueError whose one-line message names the file, the line, the event and the field; `radixlm replay` and `radixlm
trace` print it and exit with status 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from radixlm.config import SchedulerConfig
from radixlm.trace.bounded_json import loads_bounded
from radixlm.trace.trace_fields import (
    MAX_BATCHED_TOKENS,
    MAX_EVENTS,
    MAX_LINE_CHARS,
    MAX_LINE_DEPTH,
    MAX_NUM_BLOCKS,
    MAX_NUM_SEQS,
    MAX_TRACE_BYTES,
    FieldError,
    TraceError,
    shown,
)
from radixlm.trace.trace_refs import TraceReferences
from radixlm.trace.trace_schema import (
    EVENT_KINDS,
    TraceLimits,
    check_arrival,
    check_config,
    check_finish,
    check_request_event,
    check_step,
    event_kind,
)

# What-if flags with an integer value: (lowest, highest).
WHAT_IF_BOUNDS = {"max_num_batched_tokens": (1, MAX_BATCHED_TOKENS), "max_num_seqs": (1, MAX_NUM_SEQS),
                  "num_kv_blocks": (1, MAX_NUM_BLOCKS)}


@dataclass(frozen=True)
class LoadedTrace:
    """A validated trace: its config event, the events after it, and each event's line in the file."""

    config: dict[str, Any]
    events: list[dict[str, Any]]
    source: str
    line_numbers: list[int]


def display_path(path: str | os.PathLike[str]) -> str:
    """A path as error messages show it: as is when printable, else escaped (no newline or stray surrogate can reach
    the terminal)."""
    name = os.fsdecode(path)
    return name if name.isprintable() else ascii(name)


def load_trace_file(path: str | os.PathLike[str]) -> LoadedTrace:
    """Read, parse and validate a trace file; raises TraceError on the first problem."""
    source = display_path(path)
    text = _decode(_read_bounded(path, source), source)
    config: dict[str, Any] | None = None
    limits: TraceLimits | None = None
    references = TraceReferences()
    events: list[dict[str, Any]] = []
    line_numbers: list[int] = []
    for line_number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{source} line {line_number}"
        event = _parse_line(line, where)
        kind = event.get("event") if event.get("event") in EVENT_KINDS else None
        try:
            if limits is None:
                if event_kind(event) != "config":
                    raise FieldError("event", f"must be config on the first line (a trace starts with its config "
                                              f"event), got {shown(kind)}")
                config, limits = event, check_config(event)
                continue
            _check_event(event, limits, references)
        except FieldError as error:
            raise TraceError(f"{where} ({kind or 'unknown'} event): {error}") from None
        if len(events) == MAX_EVENTS:
            raise TraceError(f"{where}: the trace holds more than {MAX_EVENTS} events")
        events.append(event)
        line_numbers.append(line_number)
    if config is None:
        raise TraceError(f"{source} is empty: a trace starts with its config event")
    return LoadedTrace(config, events, source, line_numbers)


def _read_bounded(path: str | os.PathLike[str], source: str) -> bytes:
    try:
        with open(path, "rb") as file:  # one bounded read: a device or a pipe may never end
            data = file.read(MAX_TRACE_BYTES + 1)
    except (OSError, ValueError) as error:  # ValueError: a path with a NUL character
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise TraceError(f"cannot read {source}: {reason}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{source} is larger than {MAX_TRACE_BYTES} bytes, the most a trace may hold")
    return data


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_number = data.count(b"\n", 0, error.start) + 1
        raise TraceError(f"{source} line {line_number}: not UTF-8 text (byte {error.start})") from None


def _parse_line(line: str, where: str) -> dict[str, Any]:
    if len(line) > MAX_LINE_CHARS:
        raise TraceError(f"{where}: the line is {len(line)} characters long; the limit is {MAX_LINE_CHARS}")
    try:
        event = loads_bounded(line, MAX_LINE_DEPTH)
    except ValueError as error:
        raise TraceError(f"{where}: the line {error}") from None
    if not isinstance(event, dict):
        raise TraceError(f"{where}: the line must be a JSON object (one event), got {shown(event)}")
    return event


def _check_event(event: dict[str, Any], limits: TraceLimits, references: TraceReferences) -> None:
    kind = event_kind(event)
    if kind == "config":
        raise FieldError("event", "config may only be the first line")
    if kind == "arrival":
        references.arrival(event, check_arrival(event, limits).num_sequences)
    elif kind == "step":
        check_step(event)
        references.step(event)
    elif kind == "finish":
        check_finish(event)
        references.finish(event)
    elif kind == "queued":
        check_request_event(event)
        references.queued(event)
    else:
        check_request_event(event)
        references.abort(event)


def check_what_if_overrides(config: dict[str, Any], arrivals: list[dict[str, Any]], overrides: dict[str, Any]) -> None:
    """Refuse what-if flags a replay of this (validated) trace cannot run with: out of bounds, an invalid scheduler
    config, or a KV pool too small for a recorded prompt. Raises TraceError naming the flag."""
    for name, value in overrides.items():
        low, high = WHAT_IF_BOUNDS.get(name, (None, None))
        if low is not None and not low <= value <= high:
            raise TraceError(f"--{name.replace('_', '-')} must be in [{low}, {high}], got {value}")
    try:
        SchedulerConfig(**{**config["scheduler"], **{k: v for k, v in overrides.items() if k != "num_kv_blocks"}})
    except ValueError as error:
        raise TraceError(f"the what-if flags make an invalid scheduler config: {error}") from None
    if "num_kv_blocks" not in overrides:
        return
    num_blocks = overrides["num_kv_blocks"]
    context = min(config["max_model_len"], num_blocks * config["block_size"])
    for event in arrivals:
        needed = len(event["prompt_token_ids"]) + max(1, event["params"].get("min_tokens", 0))
        if needed > context:
            raise TraceError(f"--num-kv-blocks {num_blocks} holds a context of {context} tokens, but request "
                             f"{shown(event['request_id'])} needs {needed} (its prompt and at least one token)")
