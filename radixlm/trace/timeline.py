"""Read a step trace as timelines: one request's life as text, and the whole run in the Trace Event format
(chrome://tracing, Perfetto): a track for the steps and one per request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from radixlm.trace.replay import Trace
from radixlm.trace.trace_fields import TraceError, shown
from radixlm.trace.trace_file import display_path


def step_seconds(step: dict[str, Any]) -> float:
    return step["schedule_s"] + step["forward_s"] + step["sample_s"] + step["outputs_s"]


def request_timeline(trace: Trace, request_id: str) -> list[str]:
    """One line per event of the request (and its n > 1 sequences): arrival, chunks, hits, preemptions, forks,
    first token, finish, with times in seconds from the start of the trace."""
    sequences = (request_id, f"{request_id}#")
    lines: list[str] = []
    first_token_seen = False
    for event in trace.events:
        kind, time = event["event"], event.get("time", 0.0)
        if kind in ("arrival", "queued", "abort") and event["request_id"] == request_id:
            detail = f"{event['prompt_len']} prompt tokens, params {event['params']}" if kind == "arrival" else ""
            lines.append(f"{time:10.4f}  {kind} before step {event['step']} {detail}".rstrip())
        elif kind == "step":
            lines += _step_lines(event, sequences, first_token_seen)
            first_token_seen = first_token_seen or any(s[0] == request_id for s in event["sampled"])
        elif kind == "finish" and event["request_id"] == request_id:
            lines.append(f"{time:10.4f}  finished: {event['reasons']} after {event['output_tokens']} tokens, "
                         f"TTFT {_seconds(event['ttft'])}, e2e {_seconds(event['e2e'])}" + (
                             f", error {_printable(event['error'])}" if event["error"] else ""))
    if not lines:
        raise TraceError(f"request {shown(request_id)} is not in {trace.source}")
    return lines


def _printable(text: str) -> str:
    """Recorded text as one printable line: escaped if it holds a newline or a terminal control character."""
    return text if text.isprintable() else ascii(text)


def _seconds(value: float | None) -> str:
    """A recorded duration; None where there was none (the TTFT of a request aborted before its first token)."""
    return "-" if value is None else f"{value:.4f} s"


def _step_lines(step: dict[str, Any], sequences: tuple[str, str], first_token_seen: bool) -> list[str]:
    mine = lambda seq_id: seq_id == sequences[0] or seq_id.startswith(sequences[1])  # noqa: E731
    time, index, lines = step["time"], step["step"], []
    for seq_id, start, num_tokens in step["chunks"]:
        if mine(seq_id):
            what = "decode" if num_tokens == 1 else f"prefill chunk {start}..{start + num_tokens - 1}"
            hit = f" (cache hit: {step['cache_hits'][seq_id]} tokens)" if seq_id in step["cache_hits"] else ""
            lines.append(f"{time:10.4f}  step {index}: {seq_id} {what}{hit}")
    reasons = step.get("preemption_reasons") or [""] * len(step["preempted"])
    lines += [f"{time:10.4f}  step {index}: {seq_id} preempted ({_printable(reason)})"
              for seq_id, reason in zip(step["preempted"], reasons, strict=True) if mine(seq_id)]
    lines += [f"{time:10.4f}  step {index}: {child} forked from {parent}" for parent, child, _ in step["forks"]
              if mine(parent)]
    if not first_token_seen and any(s[0] == sequences[0] for s in step["sampled"]):
        lines.append(f"{time + step_seconds(step):10.4f}  step {index}: first token")
    return lines


def chrome_trace(trace: Trace) -> dict[str, Any]:
    """The Trace Event format (JSON object form): complete events ("X") for steps, queueing and chunks, instant
    events ("i") for preemptions and first tokens, metadata ("M") naming the tracks. Times in microseconds."""
    us = lambda seconds: round(seconds * 1e6, 1)  # noqa: E731
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "engine steps"}},
        {"name": "process_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": "requests"}}]
    tracks: dict[str, int] = {}
    arrived: dict[str, float] = {}
    for event in trace.events:
        if event["event"] == "arrival":
            tid = tracks.setdefault(event["request_id"], len(tracks) + 1)
            arrived[event["request_id"]] = event["time"]
            events.append({"name": "thread_name", "ph": "M", "pid": 2, "tid": tid,
                           "args": {"name": event["request_id"]}})
        elif event["event"] == "step":
            start, seconds = event["time"], step_seconds(event)
            events.append({"name": f"step {event['step']}", "ph": "X", "pid": 1, "tid": 0, "ts": us(start),
                           "dur": us(seconds), "args": {k: event[k] for k in (
                               "schedule_s", "forward_s", "sample_s", "outputs_s", "num_running", "num_waiting",
                               "kv_used_blocks")} | {"num_chunks": len(event["chunks"])} | {
                               k: event[k] for k in ("evicted_blocks", "offloaded_blocks", "loaded_blocks",
                                                     "disk_written_blocks", "disk_read_blocks")
                               if event.get(k)}})
            for seq_id, start_position, num_tokens in event["chunks"]:
                user_id = seq_id.split("#")[0]
                tid = tracks.get(user_id, 0)
                if user_id in arrived:  # its first chunk ends its queueing
                    events.append({"name": "queued", "ph": "X", "pid": 2, "tid": tid, "ts": us(arrived[user_id]),
                                   "dur": us(max(0.0, start - arrived.pop(user_id)))})
                events.append({"name": "decode" if num_tokens == 1 else "prefill", "ph": "X", "pid": 2,
                               "tid": tid, "ts": us(start), "dur": us(seconds),
                               "args": {"sequence": seq_id, "start": start_position, "tokens": num_tokens}})
            for seq_id in event["preempted"]:
                events.append({"name": "preempted", "ph": "i", "s": "t", "pid": 2,
                               "tid": tracks.get(seq_id.split("#")[0], 0), "ts": us(start)})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def export_chrome(trace: Trace, path: str | Path) -> None:
    """Write `chrome_trace(trace)` to `path`; a path that cannot be written raises TraceError naming it."""
    text = json.dumps(chrome_trace(trace))
    try:
        Path(path).write_text(text, encoding="utf-8")
    except (OSError, ValueError) as error:  # ValueError: a path with a NUL character
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise TraceError(f"cannot write {display_path(path)}: {reason}") from None
