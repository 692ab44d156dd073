"""Scheduler: continuous batching over the token-progress model; the one owner of every `Request`.

It holds the user requests' sequence groups (`sequence_groups.py`), the waiting queue and the running batch. The
step is closed on both sides: `schedule(draft_token_ids)` alone builds the frozen `SchedulerOutput` (the token
budget, chunked prefill, preemption, forks of n > 1 sequences and prompt-logprob positions: `step_plan.py`), and
`update_from_output(scheduler_output, runner_output)` applies the whole result (`step_result.py`). Every end of a
request goes through `_end`: token stops, a grammar's end, stop strings (`apply_stops`), aborts and failures
(`finish_group`, `fail_groups`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from radixlm.config import SchedulerConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.request_queue import PriorityWaitingQueue, WaitingQueue
from radixlm.core.sequence_groups import SequenceGroup
from radixlm.core.step import ModelRunnerOutput, RequestUpdate, SchedulerOutput, TextStop
from radixlm.core.step_plan import StepPlan
from radixlm.core.step_result import GrammarAcceptor, apply_step_result
from radixlm.core.token_stops import check_token_stop
from radixlm.errors import ParamError
from radixlm.request import Request, RequestStatus


class QueueFullError(RuntimeError):
    """Raised by `add_request` when `max_queued_requests` requests are already waiting."""


class Scheduler:
    """Decides, each step, which requests compute how many tokens; owns the waiting and running queues."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager, max_model_len: int,
                 grammar: GrammarAcceptor | None = None) -> None:
        """`grammar` accepts the new tokens of constrained sequences (the engine's grammar tracker), if any."""
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.max_model_len = max_model_len
        self.grammar = grammar
        self.waiting: WaitingQueue = PriorityWaitingQueue() if config.schedule_policy == "priority" \
            else WaitingQueue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # the queued and running sequences
        self.groups: dict[str, SequenceGroup] = {}  # user request id -> its group, until every sequence ended
        self._group_of: dict[str, SequenceGroup] = {}  # sequence id -> its group
        self.num_preemptions = 0
        self.num_computed_prompt_tokens = 0  # prompt tokens whose K/V were computed (not taken from the cache)
        # What the worker must hear in the next step's output: requests that left, tables that shrank.
        self._finished_request_ids: list[str] = []
        self._trimmed_block_tables: dict[str, int] = {}

    # -- admission ---------------------------------------------------------------------------------------------
    def add_request(self, request: Request, siblings: Sequence[Request] = (), held: bool = False,
                    check_queue_limit: bool = True) -> None:
        """Take a user's request: `request` computes the prompt, `siblings` (n > 1) fork from it at its first
        token. `held`: it waits for its grammar (`release` queues it). Raises ValueError if it can never fit,
        QueueFullError if the queue is full."""
        self.check_admissible(request, check_queue_limit=check_queue_limit)
        group = SequenceGroup.of([request, *siblings], held)
        taken = [s.request_id for s in group.sequences if s.request_id in self._group_of]
        if taken:
            raise ParamError("request_id", f"{taken[0]!r} is already in use")
        self.groups[request.request_id] = group
        for sequence in group.sequences:
            self._group_of[sequence.request_id] = group
        if not held:
            self._queue(request)

    def release(self, request_id: str) -> None:
        """A held group's grammar compiled: its first sequence joins the waiting queue (admitted against the queue
        limit already)."""
        group = self.groups[request_id]
        if group.held:
            group.held = False
            self._queue(group.first)

    def _queue(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def check_admissible(self, request: Request, check_queue_limit: bool = True) -> None:
        """Raise what `add_request` would raise for this request now, without taking it; held groups count against
        `max_queued_requests`."""
        if request.request_id in self._group_of:
            raise ParamError("request_id", f"{request.request_id!r} is already in use")
        pools = request.pooling_params is not None  # it generates nothing: its prompt may fill the context
        if request.num_tokens + (0 if pools else 1) > self.max_model_len:
            room = "" if pools else ", leaving no room to generate"
            raise ParamError("prompt", f"has {request.num_tokens} tokens but the context is {self.max_model_len} "
                             f"tokens (max_model_len, capped by the KV cache capacity){room}")
        min_tokens = request.sampling_params.min_tokens
        if request.num_tokens + min_tokens > self.max_model_len:
            raise ValueError(
                f"min_tokens ({min_tokens}) plus the prompt ({request.num_tokens} tokens) exceed the context of "
                f"{self.max_model_len} tokens (max_model_len)")
        limit = self.config.max_queued_requests
        num_waiting = len(self.waiting) + self.num_held
        if check_queue_limit and limit is not None and num_waiting >= limit:
            raise QueueFullError(f"{num_waiting} requests are waiting (max_queued_requests={limit})")

    # -- ends --------------------------------------------------------------------------------------------------
    def finish_group(self, request_id: str, status: RequestStatus, error: str | None = None) -> list[RequestUpdate]:
        """End every live sequence of a user's request early (aborted, or failed with `error`), freeing what they
        hold; returns their updates (none if the request is not live)."""
        group = self.groups.get(request_id)
        if group is None:
            return []
        updates = [RequestUpdate(sequence.request_id, status=status, error=error)
                   for sequence in group.sequences if not sequence.is_finished]
        for sequence in group.sequences:
            if not sequence.is_finished:
                self._end(sequence, status)
        return updates

    def fail_groups(self, errors: Mapping[str, str]) -> list[RequestUpdate]:
        """Fail the user's request of each sequence in `errors` (sequence id -> why), whole: its exception was its
        own (sampling, its grammar, its text); the others go on."""
        updates: list[RequestUpdate] = []
        for request_id, error in errors.items():
            group = self._group_of.get(request_id)
            if group is not None:
                updates += self.finish_group(group.request_id, RequestStatus.FINISHED_ERROR, error)
        return updates

    def abort(self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> bool:
        """End one live sequence early (aborted, or failed with FINISHED_ERROR) and free its blocks; False if it is
        not live. Its user request's other sequences go on (`finish_group` ends them all)."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        self._end(request, status)
        return True

    def apply_stops(self, stops: Sequence[TextStop]) -> None:
        """Stop strings the output processor found: each sequence keeps its tokens up to the stop, then finishes
        (if a token-level stop has not finished it already)."""
        for stop in stops:
            group = self._group_of.get(stop.request_id)
            if group is None:
                continue
            request = next(s for s in group.sequences if s.request_id == stop.request_id)
            request.truncate_output(stop.num_output_tokens)
            if not request.is_finished:
                self._end(request, RequestStatus.FINISHED_STOPPED, stop.stop_string)

    def finish_request(self, request: Request, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        """End a live sequence with a finished status; frees its blocks."""
        self._end(request, status, stop_reason)

    def _end(self, request: Request, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        """The one place a sequence ends: queued or running ones free their blocks and the worker hears of it; a
        held or unforked one was never scheduled. A group whose sequences all ended is forgotten."""
        group = self._group_of.get(request.request_id)
        if request.request_id in self.requests:
            if request.status is RequestStatus.RUNNING:
                self.running.remove(request)
            elif request.status is RequestStatus.WAITING:
                self.waiting.remove(request)
            self.kv_cache_manager.free(request)
            del self.requests[request.request_id]
            self._finished_request_ids.append(request.request_id)
        elif group is not None and request in group.unforked:
            group.unforked.remove(request)
        request.stop_reason = stop_reason
        request.transition(status)
        if group is not None and group.finished:
            del self.groups[group.request_id]
            for sequence in group.sequences:
                del self._group_of[sequence.request_id]

    # -- one step ----------------------------------------------------------------------------------------------
    def schedule(self, draft_token_ids: Mapping[str, Sequence[int]] | None = None) -> SchedulerOutput:
        """Pick this step's chunks within the token budget and `max_num_seqs`, preempting if blocks run out; fork
        the sequences of groups whose first sequence samples its first token (see `step_plan.py`).
        `draft_token_ids`: proposed next tokens of running sequences (speculative decoding), verified in this step
        where the budget allows."""
        for request_id, drafts in (draft_token_ids or {}).items():
            request = self.requests.get(request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                request.draft_token_ids = list(drafts)
        finished, trimmed = self._finished_request_ids, self._trimmed_block_tables
        self._finished_request_ids, self._trimmed_block_tables = [], {}
        output = StepPlan(self, finished, trimmed).build()
        if output.is_empty:  # the worker hears nothing this step: keep the news for the next one
            self._finished_request_ids = finished + self._finished_request_ids
            self._trimmed_block_tables = trimmed | self._trimmed_block_tables
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[RequestUpdate]:
        """Apply one step's whole result inside the core (see `step_result.apply_step_result`): token progress,
        new tokens, token-level stops and grammars' ends, pooled vectors, prompt logprobs, failed requests.
        Returns the news of every sequence that has some, for the output processor."""
        self.kv_cache_manager.finish_transfers(scheduler_output.kv_transfers, runner_output.kv_failed_keys)
        return apply_step_result(self, scheduler_output, runner_output)

    def append_tokens(self, request: Request, token_ids: Sequence[int], now: float) -> int:
        """Append new tokens to a running request, applying the token-level stops after each (a stop frees it and
        drops the tokens after it); returns how many were kept."""
        for num_kept, token_id in enumerate(token_ids, 1):
            request.append_output_token(token_id)
            request.record_token_time(now)
            stop = check_token_stop(request, self.max_model_len)
            if stop is not None:
                self._end(request, *stop)
                return num_kept
        return len(token_ids)

    def trim(self, request: Request) -> None:
        """Free the blocks a request's rejected drafts were written to, beyond those its tokens need."""
        num_blocks = self.kv_cache_manager.trim(request, request.num_tokens)
        if num_blocks < request.num_blocks_sent:
            request.num_blocks_sent = num_blocks
            self._trimmed_block_tables[request.request_id] = num_blocks

    # -- introspection -----------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_held(self) -> int:
        """Groups waiting for their grammar (not queued yet)."""
        return sum(group.held for group in self.groups.values())

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    def group_of(self, request_id: str) -> SequenceGroup | None:
        """The group of a live sequence."""
        return self._group_of.get(request_id)

    def is_live(self, request_id: str) -> bool:
        """Whether a sequence is known and not finished (queued, running, held or unforked)."""
        group = self._group_of.get(request_id)
        return group is not None and any(s.request_id == request_id and not s.is_finished for s in group.sequences)

    def check_invariants(self) -> None:
        """Queues and block holdings agree with request states; see KVCacheManager.check_invariants."""
        for request in self.running:
            assert request.status is RequestStatus.RUNNING, request
        for request in self.waiting:
            assert request.status is RequestStatus.WAITING, request
        assert len(self.running) + len(self.waiting) == len(self.requests)
        self.kv_cache_manager.check_invariants(self.requests.values())
