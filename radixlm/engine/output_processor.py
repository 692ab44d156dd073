"""OutputProcessor: the user's side of the engine, apart from scheduling and the model.

It owns the sequence groups (a user request and its n sequences), turns every new token into text, stop strings
and logprobs, builds the `RequestOutput`s, and ends requests early: aborted, or failed alone. An exception that
belongs to one request is caught here (`guarded`) and ends that request in the error state with its message; the
other requests go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from radixlm.core.scheduler import Scheduler
from radixlm.core.step import SchedulerOutput, TokenLogprobs
from radixlm.engine.grammars import GrammarTracker
from radixlm.engine.logprobs import LogprobFormatter, record_prompt_logprobs
from radixlm.engine.outputs import RequestOutput
from radixlm.engine.sequence_group import Sequence, SequenceGroup
from radixlm.request import Request, RequestStatus
from radixlm.trace.recorder import TraceRecorder

logger = logging.getLogger(__name__)


@dataclass
class TokenEvent:
    """New tokens of one sequence in one step (the engine core's news for the output processor)."""

    request: Request
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None  # one per token when the sequence needs them


class OutputProcessor:
    """`groups`: user request id -> its group; `sequences`: scheduler request id -> (group, sequence)."""

    def __init__(self, scheduler: Scheduler, grammars: GrammarTracker, logprob_formatter: LogprobFormatter,
                 tracer: TraceRecorder | None) -> None:
        self.scheduler = scheduler
        self.grammars = grammars
        self.logprob_formatter = logprob_formatter
        self.tracer = tracer
        self.groups: dict[str, SequenceGroup] = {}
        self.sequences: dict[str, tuple[SequenceGroup, Sequence]] = {}

    def group_of(self, request_id: str) -> SequenceGroup:
        """The group of a live scheduler request (sequence)."""
        return self.sequences[request_id][0]

    def fail_sequence(self, request_id: str, error: BaseException, phase: str, failed: list[RequestOutput]) -> None:
        """`fail` the group of a scheduler request (sequence), unless it already ended (a sibling failed first)."""
        if request_id in self.sequences:
            self.fail(self.group_of(request_id), error, phase, failed)

    def add(self, group: SequenceGroup) -> None:
        self.groups[group.request_id] = group
        for sequence in group.sequences:
            self.sequences[sequence.request.request_id] = (group, sequence)

    def end_group(self, group: SequenceGroup, status: RequestStatus, error: str | None = None) -> RequestOutput:
        """Finish every live sequence of `group` early with `status` (aborted, or failed with `error`), freeing
        what the scheduler holds, and forget the group; returns its final output."""
        for sequence in group.sequences:
            if sequence.finished:
                continue
            if not self.scheduler.abort(sequence.request.request_id, status):  # not forked or not queued yet
                sequence.request.transition(status)
            sequence.finish_reason, sequence.stop_reason = status.finish_reason, None
            group.changed.add(sequence.index)
        group.unforked = []
        group.error = error
        output = group.make_output()
        self.forget(group, output)
        return output

    def fail(self, group: SequenceGroup, error: BaseException, phase: str, failed: list[RequestOutput]) -> None:
        """An exception that belongs to `group`: end it alone in the error state; the engine goes on."""
        if group.request_id not in self.groups:
            return  # already ended in this step
        message = f"{phase} failed: {type(error).__name__}: {error}"
        logger.error("request %s: %s", group.request_id, message, exc_info=error)
        failed.append(self.end_group(group, RequestStatus.FINISHED_ERROR, message))

    def forget(self, group: SequenceGroup, final_output: RequestOutput) -> None:
        """Drop a finished group, then run its `on_finish` callback (once; what it raises is logged, not felt)."""
        self.grammars.forget(group)
        del self.groups[group.request_id]
        for sequence in group.sequences:
            del self.sequences[sequence.request.request_id]
        if self.tracer is not None:
            self.tracer.finish(group, final_output)
        if group.on_finish is not None:
            try:
                group.on_finish(final_output)
            except Exception:
                logger.exception("request %s: the on_finish callback raised (ignored)", group.request_id)

    def take_forks(self, scheduler_output: SchedulerOutput) -> list[tuple[Request, Request]]:
        """(parent, child) for each sequence to fork in this step: the unforked sequences of groups whose first
        sequence samples its first token now."""
        forks = []
        for chunk in scheduler_output.chunks:
            if not chunk.samples or chunk.request_id not in self.sequences:
                continue
            group, sequence = self.sequences[chunk.request_id]
            if sequence.index == 0 and group.unforked:
                forks += [(sequence.request, child.request) for child in group.unforked]
                group.unforked = []
        return forks

    def record_prompt_logprobs(self, positions: dict[str, tuple[int, int]],
                               entries: dict[str, list[TokenLogprobs]], failed: list[RequestOutput]) -> None:
        """Prompt logprobs of the positions computed this step (`entries[request_id]`, one per position)."""
        for request_id in positions:
            if request_id in self.sequences and request_id in entries:
                group = self.sequences[request_id][0]
                self.guarded([group], "prompt logprobs", failed, record_prompt_logprobs, group,
                             entries[request_id], self.logprob_formatter)

    def record_tokens(self, events: list[TokenEvent], failed: list[RequestOutput]) -> list[SequenceGroup]:
        """Text, stop strings and logprobs of every new token; returns the groups with news."""
        touched: dict[str, SequenceGroup] = {}
        for event in events:
            if event.request.request_id not in self.sequences:
                continue  # failed in this step
            group, sequence = self.sequences[event.request.request_id]
            if self.guarded([group], "detokenizing or stop checks", failed, self._record_tokens, sequence, event):
                group.changed.add(sequence.index)
                touched[group.request_id] = group
        return list(touched.values())

    def guarded(self, groups: list[SequenceGroup], phase: str, failed: list[RequestOutput],
                work: Callable[..., object], *args: object) -> bool:
        """Run `work(*args)`; if it raises, the exception belongs to `groups`: they fail. True if it succeeded."""
        try:
            work(*args)
        except Exception as error:
            for group in groups:
                self.fail(group, error, phase, failed)
            return False
        return True

    def _record_tokens(self, sequence: Sequence, event: TokenEvent) -> None:
        """Logprobs, text and stop strings of the sequence's new tokens; finishes it on a stop string (the tokens
        after it are dropped)."""
        request = sequence.request
        first_index = request.num_output_tokens - len(event.token_ids)
        stop_string = None
        for i, token_id in enumerate(event.token_ids):
            logprobs = event.logprobs[i] if event.logprobs is not None else None
            is_last = i == len(event.token_ids) - 1
            stop_string = sequence.add_token(token_id, first_index + i + 1, logprobs, self.logprob_formatter,
                                             stopped_by_token=is_last and request.status is
                                             RequestStatus.FINISHED_STOPPED)
            if stop_string is not None:
                request.truncate_output(first_index + i + 1)
                break
        if stop_string is not None:
            if not request.is_finished:
                self.scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED, stop_string)
            sequence.finish_reason, sequence.stop_reason = "stop", stop_string
        elif request.is_finished:
            sequence.finish_reason, sequence.stop_reason = request.status.finish_reason, request.stop_reason

    def outputs(self, groups: Iterable[SequenceGroup]) -> list[RequestOutput]:
        """One output per group with news; finished groups are forgotten."""
        outputs = []
        for group in list(groups):
            if group.request_id not in self.groups:
                continue  # failed after it got its token: its output is already out
            output = group.make_output()
            if output is not None:
                outputs.append(output)
            if group.finished:
                assert output is not None
                self.forget(group, output)
        return outputs

    def check_invariants(self) -> None:
        for group in self.groups.values():
            for sequence in group.sequences:
                live = sequence.request.request_id in self.scheduler.requests
                assert live != (sequence.finished or sequence in group.unforked), (group.request_id, sequence.index)
