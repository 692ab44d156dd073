"""OutputProcessor: the user's side of the engine, apart from scheduling and the model.

It owns the parent requests (a user's request and its n child requests, see `parent_request.py`), turns every new
token into text, stop strings and logprobs, builds the `RequestOutput`s, and ends requests early: aborted, or
failed alone. An exception that belongs to one request is caught here (`guarded`) and ends that request in the
error state with its message; the other requests go on.
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
from radixlm.engine.parent_request import ParentRequest, RequestState
from radixlm.request import Request, RequestStatus
from radixlm.trace.recorder import TraceRecorder

logger = logging.getLogger(__name__)


@dataclass
class TokenEvent:
    """New tokens of one child request in one step (the engine core's news for the output processor)."""

    request: Request
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None  # one per token when the sequence needs them


class OutputProcessor:
    """`parents`: user request id -> its ParentRequest; `states`: child request id -> (parent, its RequestState)."""

    def __init__(self, scheduler: Scheduler, grammars: GrammarTracker, logprob_formatter: LogprobFormatter,
                 tracer: TraceRecorder | None) -> None:
        self.scheduler = scheduler
        self.grammars = grammars
        self.logprob_formatter = logprob_formatter
        self.tracer = tracer
        self.parents: dict[str, ParentRequest] = {}
        self.states: dict[str, tuple[ParentRequest, RequestState]] = {}

    def parent_of(self, request_id: str) -> ParentRequest:
        """The parent of a live child request."""
        return self.states[request_id][0]

    def fail_request(self, request_id: str, error: BaseException, phase: str, failed: list[RequestOutput]) -> None:
        """`fail` the parent of a child request, unless it already ended (a sibling failed first)."""
        if request_id in self.states:
            self.fail(self.parent_of(request_id), error, phase, failed)

    def add(self, parent: ParentRequest) -> None:
        self.parents[parent.request_id] = parent
        for state in parent.children:
            self.states[state.request.request_id] = (parent, state)

    def end_parent(self, parent: ParentRequest, status: RequestStatus, error: str | None = None) -> RequestOutput:
        """Finish every live child of `parent` early with `status` (aborted, or failed with `error`), freeing
        what the scheduler holds, and forget the parent; returns its final output."""
        for state in parent.children:
            if state.finished:
                continue
            if not self.scheduler.abort(state.request.request_id, status):  # not forked or not queued yet
                state.request.transition(status)
            state.finish_reason, state.stop_reason = status.finish_reason, None
            parent.changed.add(state.index)
        parent.unforked = []
        parent.error = error
        output = parent.make_output()
        self.forget(parent, output)
        return output

    def fail(self, parent: ParentRequest, error: BaseException, phase: str, failed: list[RequestOutput]) -> None:
        """An exception that belongs to `parent`: end it alone in the error state; the engine goes on."""
        if parent.request_id not in self.parents:
            return  # already ended in this step
        message = f"{phase} failed: {type(error).__name__}: {error}"
        logger.error("request %s: %s", parent.request_id, message, exc_info=error)
        failed.append(self.end_parent(parent, RequestStatus.FINISHED_ERROR, message))

    def forget(self, parent: ParentRequest, final_output: RequestOutput) -> None:
        """Drop a finished parent, then run its `on_finish` callback (once; what it raises is logged, not felt)."""
        self.grammars.forget(parent)
        del self.parents[parent.request_id]
        for state in parent.children:
            del self.states[state.request.request_id]
        if self.tracer is not None:
            self.tracer.finish(parent, final_output)
        if parent.on_finish is not None:
            try:
                parent.on_finish(final_output)
            except Exception:
                logger.exception("request %s: the on_finish callback raised (ignored)", parent.request_id)

    def take_forks(self, scheduler_output: SchedulerOutput) -> list[tuple[Request, Request]]:
        """(child 0, child) for each child to fork in this step: the unforked children of parents whose child 0
        samples its first token now."""
        forks = []
        for chunk in scheduler_output.chunks:
            if not chunk.samples or chunk.request_id not in self.states:
                continue
            parent, state = self.states[chunk.request_id]
            if state.index == 0 and parent.unforked:
                forks += [(state.request, child.request) for child in parent.unforked]
                parent.unforked = []
        return forks

    def record_prompt_logprobs(self, positions: dict[str, tuple[int, int]],
                               entries: dict[str, list[TokenLogprobs]], failed: list[RequestOutput]) -> None:
        """Prompt logprobs of the positions computed this step (`entries[request_id]`, one per position)."""
        for request_id in positions:
            if request_id in self.states and request_id in entries:
                parent = self.states[request_id][0]
                self.guarded([parent], "prompt logprobs", failed, record_prompt_logprobs, parent,
                             entries[request_id], self.logprob_formatter)

    def record_embeddings(self, pooling_request_ids: list[str], embeddings: dict[str, list[float]],
                          failed: list[RequestOutput]) -> None:
        """Keep the vector of each pooling request whose prompt completed this step (`embeddings[request_id]`); one
        the worker returned none for, without an error of its own, fails (before the scheduler finishes it)."""
        for request_id in pooling_request_ids:
            if request_id not in self.states:
                continue  # failed in this step already
            parent = self.parent_of(request_id)
            if request_id in embeddings:
                parent.embedding = embeddings[request_id]
            else:
                self.fail(parent, RuntimeError("the worker returned no embedding"), "pooling", failed)

    def record_tokens(self, events: list[TokenEvent], failed: list[RequestOutput]) -> list[ParentRequest]:
        """Text, stop strings and logprobs of every new token; returns the parents with news."""
        touched: dict[str, ParentRequest] = {}
        for event in events:
            if event.request.request_id not in self.states:
                continue  # failed in this step
            parent, state = self.states[event.request.request_id]
            if self.guarded([parent], "detokenizing or stop checks", failed, self._record_tokens, state, event):
                parent.changed.add(state.index)
                touched[parent.request_id] = parent
        return list(touched.values())

    def guarded(self, parents: list[ParentRequest], phase: str, failed: list[RequestOutput],
                work: Callable[..., object], *args: object) -> bool:
        """Run `work(*args)`; if it raises, the exception belongs to `parents`: they fail. True if it succeeded."""
        try:
            work(*args)
        except Exception as error:
            for parent in parents:
                self.fail(parent, error, phase, failed)
            return False
        return True

    def _record_tokens(self, state: RequestState, event: TokenEvent) -> None:
        """Logprobs, text and stop strings of a child's new tokens; finishes it on a stop string (the tokens
        after it are dropped)."""
        request = state.request
        first_index = request.num_output_tokens - len(event.token_ids)
        stop_string = None
        for i, token_id in enumerate(event.token_ids):
            logprobs = event.logprobs[i] if event.logprobs is not None else None
            is_last = i == len(event.token_ids) - 1
            stop_string = state.add_token(token_id, first_index + i + 1, logprobs, self.logprob_formatter,
                                             stopped_by_token=is_last and request.status is
                                             RequestStatus.FINISHED_STOPPED)
            if stop_string is not None:
                request.truncate_output(first_index + i + 1)
                break
        if stop_string is not None:
            if not request.is_finished:
                self.scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED, stop_string)
            state.finish_reason, state.stop_reason = "stop", stop_string
        elif request.is_finished:
            state.finish_reason, state.stop_reason = request.status.finish_reason, request.stop_reason

    def outputs(self, parents: Iterable[ParentRequest]) -> list[RequestOutput]:
        """One output per parent with news; finished parents are forgotten."""
        outputs = []
        for parent in list(parents):
            if parent.request_id not in self.parents:
                continue  # failed after it got its token: its output is already out
            output = parent.make_output()
            if output is not None:
                outputs.append(output)
            if parent.finished:
                assert output is not None
                self.forget(parent, output)
        return outputs

    def check_invariants(self) -> None:
        for parent in self.parents.values():
            for state in parent.children:
                live = state.request.request_id in self.scheduler.requests
                assert live != (state.finished or state in parent.unforked), (parent.request_id, state.index)
