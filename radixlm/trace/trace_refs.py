"""The references between a trace's events, checked in file order (`TraceReferences`), and the recorded step
checked against what the replay's scheduler just did (`check_recorded_drafts`, `check_recorded_tokens`).

An event may only name requests and sequences that an earlier arrival introduced; a `queued` event only a request
that arrived unqueued; an `abort` only a live request (arrived, not finished); a step may give tokens only to the
sequences it computes or forks, and fork a request's later sequences only from its first. Each problem raises
FieldError (at load) or TraceError (during a replay) naming the field and the id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from radixlm.core.scheduler import Scheduler
from radixlm.core.step import SchedulerOutput
from radixlm.request import RequestStatus, child_request_id
from radixlm.trace.trace_fields import MAX_TOTAL_SEQUENCE_TOKENS, FieldError, TraceError, shown


@dataclass
class TraceReferences:
    """What the events read so far introduced: every sequence's user request, the live requests, those that arrived
    unqueued (waiting for a grammar), and the prompt tokens a replay will hold for all of them."""

    owners: dict[str, str] = field(default_factory=dict)  # sequence id -> user request id
    live_ids: dict[str, list[str]] = field(default_factory=dict)  # live user request id -> its sequence ids
    live_seq_ids: set[str] = field(default_factory=set)
    unqueued_ids: set[str] = field(default_factory=set)
    num_sequence_tokens: int = 0

    def arrival(self, event: dict[str, Any], num_sequences: int) -> None:
        request_id = event["request_id"]
        seq_ids = [child_request_id(request_id, index) for index in range(num_sequences)]
        taken = [seq_id for seq_id in seq_ids if seq_id in self.live_seq_ids]
        if taken:
            raise FieldError("request_id", f"{shown(request_id)} gives sequence {shown(taken[0])}, the id of a live "
                                           f"sequence (arrived earlier, not finished yet)")
        self.num_sequence_tokens += num_sequences * len(event["prompt_token_ids"])
        if self.num_sequence_tokens > MAX_TOTAL_SEQUENCE_TOKENS:
            raise FieldError("prompt_token_ids", f"brings the prompt tokens of every sequence so far to "
                                                 f"{self.num_sequence_tokens}; a replay holds at most "
                                                 f"{MAX_TOTAL_SEQUENCE_TOKENS}")
        self.owners.update((seq_id, request_id) for seq_id in seq_ids)
        self.live_ids[request_id] = seq_ids
        self.live_seq_ids.update(seq_ids)
        if not event["queued"]:
            self.unqueued_ids.add(request_id)

    def queued(self, event: dict[str, Any]) -> None:
        request_id = event["request_id"]
        if request_id not in self.unqueued_ids:
            raise FieldError("request_id", f"{shown(request_id)} is not a live request that arrived unqueued "
                                           f"(only those are queued later)")
        self.unqueued_ids.discard(request_id)

    def abort(self, event: dict[str, Any]) -> None:
        self._require_live(event["request_id"])
        self.unqueued_ids.discard(event["request_id"])

    def finish(self, event: dict[str, Any]) -> None:
        self._require_live(event["request_id"])
        self.live_seq_ids.difference_update(self.live_ids.pop(event["request_id"]))
        self.unqueued_ids.discard(event["request_id"])

    def _require_live(self, request_id: str) -> None:
        if request_id not in self.live_ids:
            raise FieldError("request_id", f"{shown(request_id)} is not a live request (it never arrived, or it "
                                           f"finished on an earlier line)")

    def step(self, event: dict[str, Any]) -> None:
        chunk_ids = {seq_id for seq_id, _, _ in event["chunks"]}
        children = {child for _, child, _ in event["forks"]}
        named: list[tuple[str, Iterable[str]]] = [
            ("chunks", chunk_ids), ("preempted", event["preempted"]), ("ended", [s for s, _ in event["ended"]]),
            ("forks", [seq_id for fork in event["forks"] for seq_id in fork[:2]]),
            ("sampled", [s for s, _ in event["sampled"]]), ("drafts", event.get("drafts", {})),
            ("cache_hits", event["cache_hits"])]
        for name, seq_ids in named:
            unknown = next((seq_id for seq_id in seq_ids if seq_id not in self.owners), None)
            if unknown is not None:
                raise FieldError(name, f"names sequence {shown(unknown)}, which no earlier arrival introduced")
        for name, seq_ids, allowed in (("sampled", [s for s, _ in event["sampled"]], chunk_ids | children),
                                       ("drafts", event.get("drafts", {}), chunk_ids),
                                       ("cache_hits", event["cache_hits"], chunk_ids)):
            stray = next((seq_id for seq_id in seq_ids if seq_id not in allowed), None)
            if stray is not None:
                raise FieldError(name, f"names sequence {shown(stray)}, which this step neither computes nor forks")
        for index, (parent, child, _) in enumerate(event["forks"]):
            owner = self.owners[parent]
            if parent != owner or child == parent or self.owners[child] != owner:
                raise FieldError(f"forks[{index}]", f"forks {shown(child)} from {shown(parent)}: a fork starts a "
                                                    f"later sequence of a request from its first sequence")


def check_recorded_drafts(scheduler: Scheduler, event: dict[str, Any]) -> None:
    """Before a replayed step: drafts are proposed for running sequences only."""
    for seq_id in event.get("drafts", {}):
        request = scheduler.requests.get(seq_id)
        if request is None or request.status is not RequestStatus.RUNNING:
            raise TraceError(f"drafts: sequence {shown(seq_id)} is not running")


def check_recorded_tokens(output: SchedulerOutput, event: dict[str, Any]) -> None:
    """After a replayed step scheduled the recorded chunks and forks: no sequence gets more tokens than its chunk
    samples (a fork child: than its parent's)."""
    num_sampled = {chunk.request_id: chunk.num_sampled for chunk in output.chunks}
    for fork in output.forks:
        num_sampled[fork.child_id] = num_sampled[fork.parent_id]
    counts: dict[str, int] = {}
    for seq_id, _ in event["sampled"]:
        counts[seq_id] = counts.get(seq_id, 0) + 1
    for seq_id, count in counts.items():
        if count > num_sampled.get(seq_id, 0):
            raise TraceError(f"sampled: sequence {shown(seq_id)} gets {count} tokens, but this step samples "
                             f"{num_sampled.get(seq_id, 0)} for it")
