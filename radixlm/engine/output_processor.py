"""OutputProcessor: the user's side of the engine, apart from scheduling and the model.

It owns the parent requests (a user's request and its n child requests, see `parent_request.py`) and turns the
core's `RequestUpdate`s into text, stop strings, logprobs and `RequestOutput`s. It holds no reference to the
scheduler and changes no `Request`: the stop strings it finds, and the requests whose text work raised, go back to
the engine (`record` returns them) for the core to apply, and the core's resulting updates come back here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radixlm.core.step import RequestError, RequestUpdate, TextStop
from radixlm.engine.grammars import GrammarTracker
from radixlm.engine.logprob_formatter import LogprobFormatter
from radixlm.engine.parent_request import ParentRequest, RequestState
from radixlm.engine.trace_recorder import TraceRecorder
from radixlm.outputs import RequestOutput
from radixlm.request import RequestStatus

logger = logging.getLogger(__name__)


class OutputProcessor:
    """`parents`: user request id -> its ParentRequest; `states`: child request id -> (parent, its RequestState)."""

    def __init__(self, grammars: GrammarTracker, logprob_formatter: LogprobFormatter,
                 tracer: TraceRecorder | None) -> None:
        self.grammars = grammars
        self.logprob_formatter = logprob_formatter
        self.tracer = tracer
        self.parents: dict[str, ParentRequest] = {}
        self.states: dict[str, tuple[ParentRequest, RequestState]] = {}
        self._changed: dict[str, ParentRequest] = {}  # parents with news since the last `take_outputs`

    def add(self, parent: ParentRequest) -> None:
        self.parents[parent.request_id] = parent
        for state in parent.children:
            self.states[state.request.request_id] = (parent, state)

    def record(self, updates: list[RequestUpdate]) -> tuple[list[TextStop], dict[str, str]]:
        """Take the core's news: text, stop strings and logprobs of new tokens, prompt logprobs, vectors, ends.
        Returns the stop strings found (for `Scheduler.apply_stops`) and the requests whose own text work raised
        (request id -> why, for `Scheduler.fail_groups`)."""
        stops: list[TextStop] = []
        failures: dict[str, str] = {}
        failing: set[str] = set()  # parents whose text work raised in this call: their news waits for their end
        for update in updates:
            if update.request_id not in self.states:
                continue  # not a user's request (or already forgotten)
            parent, state = self.states[update.request_id]
            if parent.request_id in failing and update.error is None:
                continue
            self._changed[parent.request_id] = parent
            parent.changed.add(state.index)
            try:
                stop = self._record(parent, state, update)
            except Exception as error:  # the request's own failure (detokenizing, its stop strings)
                message = str(RequestError.of("detokenizing or stop checks", error))
                logger.error("request %s: %s", parent.request_id, message, exc_info=error)
                failures[update.request_id] = message
                failing.add(parent.request_id)
                continue
            if stop is not None:
                stops.append(stop)
        return stops, failures

    def _record(self, parent: ParentRequest, state: RequestState, update: RequestUpdate) -> TextStop | None:
        if update.prompt_logprobs is not None:
            assert parent.prompt_logprobs is not None
            parent.prompt_logprobs += [None if entry is None else self.logprob_formatter.position(entry)
                                       for entry in update.prompt_logprobs]
        if update.embedding is not None:
            parent.embedding = update.embedding
        stop = self._record_tokens(state, update) if update.new_token_ids else None
        if update.error is not None and parent.error is None:
            parent.error = update.error
            logger.error("request %s: %s", parent.request_id, update.error)
        if stop is not None:
            state.finish_reason, state.stop_reason = "stop", stop.stop_string
        elif update.status is not None and not state.finished:
            state.finish_reason, state.stop_reason = update.status.finish_reason, update.stop_reason
        return stop

    def _record_tokens(self, state: RequestState, update: RequestUpdate) -> TextStop | None:
        """Logprobs and text of a child's new tokens; the stop string one of them completes, if any (the tokens
        after it are not shown)."""
        num_output_tokens = state.request.num_output_tokens
        first_index = num_output_tokens - len(update.new_token_ids)
        for i, token_id in enumerate(update.new_token_ids):
            logprobs = update.new_logprobs[i] if update.new_logprobs is not None else None
            is_last = i == len(update.new_token_ids) - 1
            stop_string = state.add_token(token_id, first_index + i + 1, logprobs, self.logprob_formatter,
                                          stopped_by_token=is_last and update.status is
                                          RequestStatus.FINISHED_STOPPED)
            if stop_string is not None:
                return TextStop(update.request_id, first_index + i + 1, stop_string)
        return None

    def take_outputs(self) -> list[RequestOutput]:
        """One output per parent with news since the last call; finished parents are forgotten."""
        outputs = []
        changed, self._changed = self._changed, {}
        for parent in changed.values():
            output = self._output_of(parent)
            if output is not None:
                outputs.append(output)
        return outputs

    def take_output(self, request_id: str) -> RequestOutput | None:
        """The output of one parent with news (e.g. just aborted), taken out of the next `take_outputs`."""
        parent = self._changed.pop(request_id, None)
        return self._output_of(parent) if parent is not None else None

    def _output_of(self, parent: ParentRequest) -> RequestOutput | None:
        output = parent.make_output()
        if parent.finished:
            assert output is not None
            self._forget(parent, output)
        return output

    def _forget(self, parent: ParentRequest, final_output: RequestOutput) -> None:
        """Drop a finished parent, then run its `on_finish` callback (once; what it raises is logged, not felt)."""
        self.grammars.forget(parent)
        del self.parents[parent.request_id]
        for state in parent.children:
            del self.states[state.request.request_id]
        if self.tracer is not None:
            self.tracer.finish(parent, final_output)
        _run_callback(parent.on_finish, final_output, parent.request_id)

    def check_invariants(self, is_live: Callable[[str], bool]) -> None:
        """Every unfinished child is live in the core (`is_live(request id)`), and no finished one is."""
        for parent in self.parents.values():
            for state in parent.children:
                assert is_live(state.request.request_id) != state.finished, (parent.request_id, state.index)


def _run_callback(callback: Callable[[RequestOutput], object] | None, output: RequestOutput, request_id: str) -> None:
    if callback is None:
        return
    try:
        callback(output)
    except Exception:
        logger.exception("request %s: the on_finish callback raised (ignored)", request_id)
