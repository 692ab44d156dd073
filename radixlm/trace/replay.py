"""Replay a step trace through a fresh scheduler and KV manager (no model: a stand-in returns the recorded tokens).

- `replay(trace)`: the recorded arrivals, aborts and token events at their recorded steps; every step must schedule
  the recorded chunks and preemptions. Returns the first divergence, or None.
- `what_if(trace, **overrides)` (`what_if.py`) runs the same requests under other scheduler flags, with step times
  from a cost model fitted to the trace.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixlm.config import SchedulerConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.core.step import ModelRunnerOutput, RequestError, SchedulerOutput
from radixlm.lora_request import LoRARequest
from radixlm.request import Request, RequestStatus, child_request_id
from radixlm.sampling_params import SamplingParams
from radixlm.trace.trace_fields import TraceError
from radixlm.trace.trace_file import load_trace_file
from radixlm.trace.trace_refs import check_recorded_drafts, check_recorded_tokens


@dataclass
class Trace:
    config: dict[str, Any]
    events: list[dict[str, Any]]
    source: str = "trace"  # the file, as error messages name it
    line_numbers: list[int] = field(default_factory=list)  # each event's line in the file

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read and validate a trace file (`trace_file.py`): a file that is missing, too large, not UTF-8 JSON
        lines, or whose events have missing, mistyped, out-of-range or dangling fields raises TraceError (a
        ValueError) naming the file, the line, the event and the field."""
        loaded = load_trace_file(path)
        return cls(loaded.config, loaded.events, loaded.source, loaded.line_numbers)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["event"] == kind]

    @contextlib.contextmanager
    def blame(self, index: int) -> Iterator[None]:
        """Turn what the scheduler refuses while event `index` replays (ValueError; RuntimeError: an illegal state
        change) into a TraceError naming the event's file and line: the trace contradicts itself there."""
        try:
            yield
        except (ValueError, RuntimeError) as error:
            line = self.line_numbers[index] if self.line_numbers else index + 2  # built in memory: one a line
            raise TraceError(f"{self.source} line {line} ({self.events[index]['event']} event): {error}") from None


@dataclass
class ReplayState:
    """A scheduler rebuilt from a trace's config, and the requests of the arrivals seen so far."""

    scheduler: Scheduler
    eos_token_ids: frozenset[int]
    requests: dict[str, Request] = field(default_factory=dict)  # sequence id -> request
    parents: dict[str, list[str]] = field(default_factory=dict)  # user request id -> its sequence ids
    group_of: dict[str, str] = field(default_factory=dict)  # sequence id -> its user request id

    @classmethod
    def build(cls, config: dict[str, Any], **overrides: Any) -> ReplayState:
        scheduler_options = {**config["scheduler"], **{k: v for k, v in overrides.items() if k != "num_kv_blocks"}}
        num_blocks = overrides.get("num_kv_blocks") or config["num_blocks"]
        manager = KVCacheManager(num_blocks, config["block_size"], config["enable_prefix_caching"],
                                 config.get("num_host_blocks", 0))
        scheduler = Scheduler(SchedulerConfig(**scheduler_options), manager,
                              min(config["max_model_len"], num_blocks * config["block_size"]))
        return cls(scheduler, frozenset(config["eos_token_ids"]))

    def arrive(self, event: dict[str, Any], arrival_time: float | None = None, held: bool | None = None) -> Request:
        """Build the request's sequences and give them to the scheduler, `held` (default: as recorded, when it
        arrived with its grammar compiling) until its `queued` event; returns the first."""
        params = SamplingParams.from_dict(event["params"])
        ids = [child_request_id(event["request_id"], i) for i in range(params.num_sequences)]
        for seq_id in ids:
            self.requests[seq_id] = Request(seq_id, event["prompt_token_ids"], params, self.eos_token_ids,
                                            arrival_order=len(self.parents), priority=event["priority"],
                                            arrival_time=arrival_time, lora_request=_lora_of(event))
        self.parents[event["request_id"]] = ids
        self.group_of.update(dict.fromkeys(ids, event["request_id"]))
        first = self.requests[ids[0]]
        self.scheduler.add_request(first, [self.requests[seq_id] for seq_id in ids[1:]],
                                   held=not event["queued"] if held is None else held, check_queue_limit=False)
        return first

    def end(self, seq_id: str, status: RequestStatus) -> None:
        """A recorded end the engine decided (a stop string, a grammar's end, a failure, an abort), applied through
        the scheduler; nothing if the replayed core ended the sequence already."""
        if not self.scheduler.is_live(seq_id):
            return
        if status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR):
            self.scheduler.finish_group(self.group_of[seq_id], status)
        else:
            self.scheduler.finish_request(self.requests[seq_id], status)

    def abort(self, request_id: str) -> None:
        self.scheduler.finish_group(request_id, RequestStatus.FINISHED_ABORTED)


@dataclass
class Divergence:
    step: int
    recorded: dict[str, Any]
    replayed: dict[str, Any]

    def __str__(self) -> str:
        return (f"step {self.step} diverges:\n  recorded: {json.dumps(self.recorded)}\n"
                f"  replayed: {json.dumps(self.replayed)}")


def chunk_view(output: SchedulerOutput) -> dict[str, Any]:
    return {"chunks": [[c.request_id, c.start_position, c.num_tokens] for c in output.chunks],
            "preempted": list(output.preempted_request_ids),
            "forks": [[fork.parent_id, fork.child_id] for fork in output.forks]}


def replay(trace: Trace) -> tuple[int, Divergence | None]:
    """Replay every recorded step; returns the number of steps that matched and the first divergence. An event the
    replay cannot apply (it contradicts what the scheduler holds) raises TraceError naming its line."""
    state = ReplayState.build(trace.config)
    scheduler = state.scheduler
    num_matched = 0
    for index, event in enumerate(trace.events):
        with trace.blame(index):
            kind = event["event"]
            if kind == "arrival":
                state.arrive(event)
            elif kind == "queued":
                scheduler.release(event["request_id"])
            elif kind == "abort":
                state.abort(event["request_id"])
            elif kind == "step":
                check_recorded_drafts(scheduler, event)
                output = scheduler.schedule(event.get("drafts", {}))  # proposed before the step was scheduled
                recorded = {"chunks": event["chunks"], "preempted": event["preempted"],
                            "forks": [[parent, child] for parent, child, _ in event["forks"]]}
                if chunk_view(output) != recorded:
                    return num_matched, Divergence(event["step"], recorded, chunk_view(output))
                check_recorded_tokens(output, event)
                apply_recorded_tokens(state, output, event)
                num_matched += 1
    return num_matched, None


def apply_recorded_tokens(state: ReplayState, output: SchedulerOutput, event: dict[str, Any]) -> None:
    """The recorded step's result through the core's own update path: the sampled tokens (the core applies token
    stops, forks' first tokens, progress), the failures, then the ends the engine decided after it."""
    ended = {seq_id: RequestStatus[status] for seq_id, status in event["ended"]}
    tokens: dict[str, list[int]] = {}
    for seq_id, token in event["sampled"]:
        tokens.setdefault(seq_id, []).append(token)
    failed = RequestError("the recorded step", "RecordedFailure", "failed when it was recorded")
    errors = {seq_id: failed for seq_id, status in ended.items()
              if status is RequestStatus.FINISHED_ERROR and (event.get("forward_failed") or seq_id not in tokens)}
    state.scheduler.update_from_output(output, ModelRunnerOutput(list(tokens), list(tokens.values()),
                                                                 [None] * len(tokens), errors=errors))
    for seq_id, status in ended.items():
        state.end(seq_id, status)


def _lora_of(event: dict[str, Any]) -> LoRARequest | None:
    """The recorded adapter of an arrival (its prefixes are kept apart in the replayed radix tree); no path: a
    replay runs no model."""
    if "lora_id" not in event:
        return None
    return LoRARequest(event["lora_name"], event["lora_id"], "(recorded)")
