"""GrammarTracker: the engine's side of constrained decoding.

A request with `structured_outputs` waits here (not in the scheduler) until its grammar is compiled on the
compile thread, so it never stalls the batch. Each of its sequences then gets its own matcher. Every step the
matchers of the constrained sampling sequences fill a bitmask of the tokens they allow next, which the step sends
the worker (`GrammarBitmask`); every new token is accepted by its sequence's matcher; a sequence whose grammar
terminates finishes. A sequence verifying drafts gets one mask per position: the matcher accepts the drafts one by
one, filling the mask after each, then rolls back.

Preemption needs no rollback: recompute preemption keeps the generated tokens, so a matcher stays in step with its
sequence (tests check constrained outputs are identical with and without preemption).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from concurrent.futures import Future

from radixlm.engine.parent_request import ParentRequest
from radixlm.structured.backend import GrammarMatcher
from radixlm.structured.bitmask import GrammarBitmask
from radixlm.structured.manager import StructuredOutputs

logger = logging.getLogger(__name__)


class GrammarTracker:
    def __init__(self, structured: StructuredOutputs) -> None:
        self.structured = structured
        self._waiting: dict[str, tuple[ParentRequest, Future[object]]] = {}  # request id -> parent, compile
        self._matchers: dict[str, GrammarMatcher] = {}  # child request id -> its matcher

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def submit(self, parent: ParentRequest) -> bool:
        """Start compiling the parent's grammar; True if it is ready now (matchers attached). Raises the compile's
        ValueError if it already failed."""
        spec = parent.params.structured_outputs
        assert spec is not None
        future = self.structured.submit(spec)  # type: ignore[arg-type]
        if future.done():
            self._attach(parent, future.result())  # raises ValueError for a bad grammar
            return True
        self._waiting[parent.request_id] = (parent, future)
        return False

    def take_compiled(self) -> tuple[list[ParentRequest], list[tuple[ParentRequest, Exception]]]:
        """Groups whose compile finished since the last call: (ready ones, failed ones with their error)."""
        ready, failed = [], []
        for request_id, (parent, future) in list(self._waiting.items()):
            if not future.done():
                continue
            del self._waiting[request_id]
            error = future.exception()
            if error is None:
                self._attach(parent, future.result())
                ready.append(parent)
            else:
                failed.append((parent, error if isinstance(error, Exception) else RuntimeError(str(error))))
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block until some waiting compile finishes (when the engine has nothing else to do)."""
        concurrent.futures.wait([f for _, f in self._waiting.values()], timeout=timeout,
                                return_when=concurrent.futures.FIRST_COMPLETED)

    def _attach(self, parent: ParentRequest, compiled: object) -> None:
        for state in parent.children:
            self._matchers[state.request.request_id] = self.structured.new_matcher(compiled)

    def bitmask(self, request_ids: list[str], drafts: dict[str, list[int]],
                on_error: Callable[[str, Exception], object]) -> GrammarBitmask | None:
        """The allowed next tokens of the constrained ones among `request_ids` (those sampling this step), one row
        per position verified (`drafts[request_id]`), or None when none is constrained. A matcher that raises is
        reported to `on_error(request_id, error)` and left out."""
        constrained = [request_id for request_id in request_ids if request_id in self._matchers]
        if not constrained:
            return None
        num_rows = sum(1 + len(drafts.get(request_id, ())) for request_id in constrained)
        bitmask = self.structured.backend.allocate_bitmask(num_rows)
        rows: list[tuple[str, int]] = []
        for request_id in constrained:
            try:
                rows += self._fill(request_id, drafts.get(request_id, []), bitmask, len(rows))
            except Exception as error:
                on_error(request_id, error)
        return GrammarBitmask([r for r, _ in rows], bitmask[:len(rows)], [j for _, j in rows]) if rows else None

    def _fill(self, request_id: str, drafts: list[int], bitmask: object, first_row: int) -> list[tuple[str, int]]:
        """Rows `first_row ..` of `bitmask`: what the matcher allows now, and after each draft it accepts; a
        draft it refuses ends them (its position's sample cannot equal it, so later rows are never kept)."""
        matcher = self._matchers[request_id]
        matcher.fill_bitmask(bitmask, first_row)  # type: ignore[arg-type]
        num_accepted = 0
        for draft in drafts:
            if not matcher.accept_token(draft) or matcher.is_terminated():
                break
            num_accepted += 1
            matcher.fill_bitmask(bitmask, first_row + num_accepted)  # type: ignore[arg-type]
        if num_accepted:
            matcher.rollback(num_accepted)
        return [(request_id, j) for j in range(num_accepted + 1)]

    def accept(self, request_id: str, token_ids: list[int]) -> int | None:
        """Feed a sequence's new tokens to its matcher, in order; returns how many were taken when its grammar
        terminated (or refused one), else None (also without a grammar). The core's `GrammarAcceptor`."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return None
        for count, token_id in enumerate(token_ids, 1):
            if not matcher.accept_token(token_id):
                logger.warning("request %s: token %d is outside its grammar", request_id, token_id)
                return count
            if matcher.is_terminated():
                return count
        return None

    def forget(self, parent: ParentRequest) -> None:
        self._waiting.pop(parent.request_id, None)
        for state in parent.children:
            self._matchers.pop(state.request.request_id, None)
