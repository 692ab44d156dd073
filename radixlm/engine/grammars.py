"""GrammarTracker: the engine's side of constrained decoding.

A request with `structured_outputs` waits here (not in the scheduler) until its grammar is compiled on the
compile thread, so it never stalls the batch. Each of its sequences then gets its own matcher. Every step the
constrained rows of the logits are masked to what their matchers allow (the other rows are not touched), and every
sampled token is accepted by its sequence's matcher; a sequence whose grammar terminates finishes.

Preemption needs no rollback: recompute preemption keeps the generated tokens, so a matcher stays in step with its
sequence (tests check constrained outputs are identical with and without preemption).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from concurrent.futures import Future

import torch

from radixlm.engine.sequence_group import SequenceGroup
from radixlm.request import Request
from radixlm.structured.backend import GrammarMatcher
from radixlm.structured.manager import StructuredOutputs

logger = logging.getLogger(__name__)


class GrammarTracker:
    def __init__(self, structured: StructuredOutputs) -> None:
        self.structured = structured
        self._waiting: dict[str, tuple[SequenceGroup, Future[object]]] = {}  # request id -> group, compile
        self._matchers: dict[str, GrammarMatcher] = {}  # scheduler request id -> its sequence's matcher

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def submit(self, group: SequenceGroup) -> bool:
        """Start compiling the group's grammar; True if it is ready now (matchers attached). Raises the compile's
        ValueError if it already failed."""
        spec = group.params.structured_outputs
        assert spec is not None
        future = self.structured.submit(spec)  # type: ignore[arg-type]
        if future.done():
            self._attach(group, future.result())  # raises ValueError for a bad grammar
            return True
        self._waiting[group.request_id] = (group, future)
        return False

    def take_compiled(self) -> tuple[list[SequenceGroup], list[tuple[SequenceGroup, Exception]]]:
        """Groups whose compile finished since the last call: (ready ones, failed ones with their error)."""
        ready, failed = [], []
        for request_id, (group, future) in list(self._waiting.items()):
            if not future.done():
                continue
            del self._waiting[request_id]
            error = future.exception()
            if error is None:
                self._attach(group, future.result())
                ready.append(group)
            else:
                failed.append((group, error if isinstance(error, Exception) else RuntimeError(str(error))))
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block until some waiting compile finishes (when the engine has nothing else to do)."""
        concurrent.futures.wait([f for _, f in self._waiting.values()], timeout=timeout,
                                return_when=concurrent.futures.FIRST_COMPLETED)

    def _attach(self, group: SequenceGroup, compiled: object) -> None:
        for sequence in group.sequences:
            self._matchers[sequence.request.request_id] = self.structured.new_matcher(compiled)

    def mask_function(self, requests: list[Request]) -> Callable[[torch.Tensor], None] | None:
        """The masking stage for the sampler over `requests` (its rows), or None when none is constrained."""
        if not self._matchers:
            return None
        rows = [row for row, request in enumerate(requests) if request.request_id in self._matchers]
        if not rows:
            return None
        matchers = [self._matchers[requests[row].request_id] for row in rows]
        return lambda logits: self.structured.apply_masks(logits, rows, matchers)

    def accept(self, request: Request) -> bool:
        """Feed the request's newest token to its matcher; True when its grammar has terminated."""
        matcher = self._matchers.get(request.request_id)
        if matcher is None:
            return False
        if not matcher.accept_token(request.last_token_id):
            logger.warning("request %s: token %d is outside its grammar", request.request_id, request.last_token_id)
            return True
        return matcher.is_terminated()

    def forget(self, group: SequenceGroup) -> None:
        self._waiting.pop(group.request_id, None)
        for sequence in group.sequences:
            self._matchers.pop(sequence.request.request_id, None)
