"""Scheduler: continuous batching over the token-progress model.

Each step fills a token budget: first one token for every running request that is decoding, then prefill chunks
for running requests that are part-way through their prompt, then new chunks for waiting requests. When blocks
run out it preempts by recompute: the victim (lowest priority, then latest arrival) frees its blocks, forgets its
computed tokens, keeps its generated ones and goes back to the waiting queue. Under the priority policy a waiting
request also preempts running ones of strictly lower priority when blocks or `max_num_seqs` run out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from radixlm.config import SchedulerConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.prefix_policy import (
    InFlightPrefill,
    duplicates_in_flight_prefill,
    order_by_cached_prefix,
    reuses_prefix_cache,
)
from radixlm.core.request_queue import PriorityWaitingQueue, WaitingQueue
from radixlm.core.step import ForkedRequest, NewRequestData, ScheduledChunk, SchedulerOutput
from radixlm.core.token_stops import check_token_stop, drafts_within_limits
from radixlm.request import Request, RequestStatus


class QueueFullError(RuntimeError):
    """Raised by `add_request` when `max_queued_requests` requests are already waiting."""


class Scheduler:
    """Decides, each step, which requests compute how many tokens; owns the waiting and running queues."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.max_model_len = max_model_len
        self.waiting: WaitingQueue = PriorityWaitingQueue() if config.schedule_policy == "priority" \
            else WaitingQueue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_computed_prompt_tokens = 0  # prompt tokens whose K/V were computed (not taken from the cache)
        # What the worker must hear in the next step's output: requests that left, tables that shrank.
        self._finished_request_ids: list[str] = []
        self._trimmed_block_tables: dict[str, int] = {}

    # -- admission ---------------------------------------------------------------------------------------------
    def add_request(self, request: Request, check_queue_limit: bool = True) -> None:
        """Queue a request; raises ValueError if it can never fit, QueueFullError if the queue is full (unless the
        caller admitted it against the limit already, e.g. before it waited for its grammar)."""
        self.check_admissible(request, check_queue_limit=check_queue_limit)
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def check_admissible(self, request: Request, num_pending: int = 0, check_queue_limit: bool = True) -> None:
        """Raise what `add_request` would raise for this request now, without queueing it; `num_pending` requests
        held elsewhere before they queue (waiting for a grammar) count against `max_queued_requests`."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        pools = request.pooling_params is not None  # it generates nothing: its prompt may fill the context
        if request.num_tokens + (0 if pools else 1) > self.max_model_len:
            room = "" if pools else ", leaving no room to generate"
            raise ValueError(f"prompt has {request.num_tokens} tokens but the context is {self.max_model_len} "
                             f"tokens (max_model_len, capped by the KV cache capacity){room}")
        min_tokens = request.sampling_params.min_tokens
        if request.num_tokens + min_tokens > self.max_model_len:
            raise ValueError(
                f"min_tokens ({min_tokens}) plus the prompt ({request.num_tokens} tokens) exceed the context of "
                f"{self.max_model_len} tokens (max_model_len)")
        limit = self.config.max_queued_requests
        num_waiting = len(self.waiting) + num_pending
        if check_queue_limit and limit is not None and num_waiting >= limit:
            raise QueueFullError(f"{num_waiting} requests are waiting (max_queued_requests={limit})")

    def abort(self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> bool:
        """End a waiting, running or preempted request early (aborted, or failed with FINISHED_ERROR) and free its
        blocks; False if it is not live."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        self.finish_request(request, status)
        return True

    def finish_request(self, request: Request, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        """End a live request with a finished status; frees its blocks."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.stop_reason = stop_reason
        request.transition(status)
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self._finished_request_ids.append(request.request_id)

    def fork_request(self, parent: Request, child: Request, output: SchedulerOutput) -> None:
        """Start `child`, a new sequence with `parent`'s prompt (n > 1 sampling), in the step of `output` where
        `parent` samples its first token: running, sharing the K/V of `parent`'s prompt, and given its first token
        by `update_from_output` (see `ForkedRequest` and KVCacheManager.fork)."""
        if child.request_id in self.requests:
            raise ValueError(f"request_id {child.request_id!r} is already in use")
        copies = self.kv_cache_manager.fork(parent, child, parent.num_tokens)
        child.transition(RequestStatus.RUNNING)
        self.running.append(child)
        self.requests[child.request_id] = child
        child.num_blocks_sent = len(child.block_table)
        output.forks.append(ForkedRequest(parent.request_id, child.request_id, child.sampling_seed,
                                          list(child.block_table), copies))

    # -- one step ----------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Pick this step's chunks within the token budget and `max_num_seqs`, preempting if blocks run out."""
        output = SchedulerOutput(finished_request_ids=self._finished_request_ids,
                                 trimmed_block_tables=self._trimmed_block_tables)
        self._finished_request_ids, self._trimmed_block_tables = [], {}
        budget = self.config.max_num_batched_tokens
        decoding = [r for r in self.running if r.num_uncomputed_tokens == 1]
        prefilling = [r for r in self.running if r.num_uncomputed_tokens > 1]
        scheduled: dict[str, ScheduledChunk] = {}
        draft_budget = max(0, budget - len(decoding))  # drafts never take the token of another decode
        for request in decoding + prefilling:
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_drafts = min(len(drafts_within_limits(request, self.max_model_len)), draft_budget)
            request.draft_token_ids = request.draft_token_ids[:num_drafts]
            num_new = min(request.num_uncomputed_tokens + num_drafts, budget)
            if num_new == 0:
                break
            while not self.kv_cache_manager.allocate_slots(request, num_new):
                if num_drafts:  # speculation backs off before anyone is preempted
                    request.draft_token_ids, num_drafts = [], 0
                    num_new = min(request.num_uncomputed_tokens, budget)
                    continue
                victim = max(self.running, key=preemption_rank)
                budget += self._preempt_scheduled(victim, scheduled, output,
                                                  f"out of KV blocks for {request.request_id}")
                if victim is request:
                    break
            else:
                scheduled[request.request_id] = self._chunk(request, num_new)
                budget -= num_new
                draft_budget -= num_drafts
        if not output.preempted_request_ids:
            self._schedule_waiting(budget, scheduled, output)
        output.chunks = list(scheduled.values())
        if not output.chunks:  # the worker hears nothing this step: keep the news for the next one
            self._finished_request_ids = output.finished_request_ids + self._finished_request_ids
            self._trimmed_block_tables = output.trimmed_block_tables | self._trimmed_block_tables
        if not output.chunks and not self.running and self.waiting and not output.preempted_request_ids:
            raise RuntimeError(f"scheduler made no progress with {len(self.waiting)} waiting requests and nothing "
                               f"running (first: {self.waiting.peek()!r}); this is a bug")
        return output

    def _schedule_waiting(self, budget: int, scheduled: dict[str, ScheduledChunk], output: SchedulerOutput) -> None:
        """Admit waiting requests in queue order, each starting from its cached prefix."""
        if not self.waiting:
            return
        kv = self.kv_cache_manager
        if (self.config.schedule_policy == "lpm" and kv.radix_cache is not None
                and len(self.waiting) <= self.config.lpm_fallback_queue_len):
            self.waiting.reorder(order_by_cached_prefix(list(self.waiting), kv))
        in_flight = [InFlightPrefill(self.requests[c.request_id].all_token_ids, c.start_position, c.context_len)
                     for c in scheduled.values() if c.num_tokens > 1] if kv.radix_cache is not None else []
        for request in list(self.waiting):
            if budget == 0 or (freed := self._make_seats(request, scheduled, output)) is None:
                break
            budget += freed
            reuse_cache = reuses_prefix_cache(request)  # not with prompt logprobs or mean pooling
            match = kv.match_prefix(request) if reuse_cache else None
            num_cached = match.num_tokens if match else 0
            if reuse_cache and in_flight and kv.radix_cache is not None and \
                    duplicates_in_flight_prefill(request, num_cached, in_flight):
                continue  # next step its prefix is in the tree
            num_new = min(request.num_tokens - num_cached, budget)
            admitted = kv.allocate_with_prefix(request, match, num_new, output.block_copies)
            while not admitted and (freed := self._preempt_lower_priority(request, scheduled, output)) is not None:
                budget += freed
                admitted = kv.allocate_with_prefix(request, match, num_new, output.block_copies)
            if not admitted and match is not None and not self.running:
                # Alone and still short: the matched path also pins the copies the tree keeps where branches start
                # inside a block. Starting from nothing lets eviction free the whole tree, and it always fits.
                match, num_new = None, min(request.num_tokens, budget)
                admitted = kv.allocate_with_prefix(request, None, num_new, output.block_copies)
            if not admitted:
                break
            first_admission = request.times.first_scheduled is None
            self.waiting.remove(request)
            request.num_blocks_sent = 0  # new to the worker (again, after a preemption)
            output.new_requests.append(NewRequestData.of(request))
            request.transition(RequestStatus.RUNNING)
            self.running.append(request)
            if first_admission:
                kv.record_admission(request)
            chunk = self._chunk(request, num_new)
            scheduled[request.request_id] = chunk
            budget -= num_new
            if num_new > 1:
                in_flight.append(InFlightPrefill(request.all_token_ids, chunk.start_position, chunk.context_len))

    def _make_seats(self, request: Request, scheduled: dict[str, ScheduledChunk],
                    output: SchedulerOutput) -> int | None:
        """Make room within `max_num_seqs` for all of `request`'s sequences (preempting lower-priority ones under
        the priority policy). Returns the budget the victims' chunks give back, or None if there is no room."""
        num_seats = num_sequences_to_seat(request)
        freed = 0
        while self.running and sum(map(num_sequences_to_seat, self.running)) + num_seats > self.config.max_num_seqs:
            victim_budget = self._preempt_lower_priority(request, scheduled, output)
            if victim_budget is None:
                return None
            freed += victim_budget
        return freed

    def _preempt_lower_priority(self, request: Request, scheduled: dict[str, ScheduledChunk],
                                output: SchedulerOutput) -> int | None:
        """Priority policy: make room for `request` by preempting the lowest-priority running request, if that one
        ranks strictly below it. Returns the budget the victim's chunk gives back, or None if nobody ranks below."""
        if self.config.schedule_policy != "priority" or not self.running:
            return None
        victim = max(self.running, key=preemption_rank)
        if victim.priority <= request.priority:
            return None
        return self._preempt_scheduled(victim, scheduled, output,
                                       f"priority: {request.request_id} (priority {request.priority}) needed room")

    def _preempt_scheduled(self, victim: Request, scheduled: dict[str, ScheduledChunk],
                           output: SchedulerOutput, reason: str) -> int:
        """Preempt `victim`, dropping its chunk from this step; returns the budget that chunk gives back."""
        self._preempt(victim)
        output.preempted_request_ids.append(victim.request_id)
        output.preemption_reasons.append(reason)
        chunk = scheduled.pop(victim.request_id, None)
        return chunk.num_tokens if chunk else 0

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.draft_token_ids = []
        request.transition(RequestStatus.PREEMPTED)
        request.transition(RequestStatus.WAITING)
        self.waiting.add_preempted(request)
        self.num_preemptions += 1

    def _chunk(self, request: Request, num_new: int) -> ScheduledChunk:
        """The next `num_new` tokens of `request` (its drafts after its own tokens, when it reaches them)."""
        start = request.num_computed_tokens
        token_ids = request.all_token_ids[start:start + num_new]
        num_sampled = 0
        reaches_end = start + num_new >= request.num_tokens
        if reaches_end and request.pooling_params is None:
            drafts = drafts_within_limits(request, self.max_model_len)[:start + num_new - request.num_tokens]
            token_ids += drafts
            num_sampled = 1 + len(drafts)
        new_block_ids = request.block_table[request.num_blocks_sent:]
        request.num_blocks_sent = len(request.block_table)
        return ScheduledChunk(request.request_id, token_ids, start, new_block_ids, num_sampled,
                              pools=reaches_end and request.pooling_params is not None)

    def update_from_output(self, output: SchedulerOutput,
                           sampled_token_ids: Mapping[str, Sequence[int]]) -> list[tuple[Request, int]]:
        """Advance token progress, append the new tokens, apply token-level stops.

        `sampled_token_ids[request_id]`: the tokens a sampling request (or forked child) of `output` receives: one,
        or its accepted drafts and one more; a request missing there (it failed) gets none. Rejected drafts are
        not computed: the request's progress stops after the last accepted one and its block table is trimmed,
        so the radix tree only ever sees final tokens. A pooling request whose chunk `pools` has its prompt
        computed: it finishes (stop) with no token. Returns each request that received tokens with how many it
        kept (a token-level stop drops those after it), and each pooling request that finished with 0; finished
        ones included, already freed.
        """
        now = time.monotonic()
        updated: list[tuple[Request, int]] = []
        for chunk in output.chunks:
            request = self.requests.get(chunk.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            self.num_computed_prompt_tokens += max(
                0, min(chunk.context_len, request.num_prompt_tokens) - chunk.start_position)
            token_ids = sampled_token_ids.get(chunk.request_id, ()) if chunk.samples else ()
            num_rejected = chunk.num_draft_tokens - max(0, len(token_ids) - 1) if token_ids else 0
            request.num_computed_tokens += chunk.num_tokens - num_rejected
            request.draft_token_ids = []
            if chunk.pools:  # its whole prompt is computed: the worker returned its vector, and it samples nothing
                self.finish_request(request, RequestStatus.FINISHED_STOPPED)
                updated.append((request, 0))
                continue
            if token_ids:  # before caching: accepted drafts are computed tokens the tree needs to know
                updated.append((request, self.append_tokens(request, token_ids, now)))
            if request.is_finished:
                continue  # freed: its computed tokens went to the tree
            if chunk.num_tokens > 1:
                self.kv_cache_manager.cache_computed(request)  # later requests (and this one, if preempted) hit
            if num_rejected:
                self._trim(request)
        for fork in output.forks:
            child = self.requests.get(fork.child_id)
            if child is not None and child.status is RequestStatus.RUNNING and fork.child_id in sampled_token_ids:
                updated.append((child, self.append_tokens(child, sampled_token_ids[fork.child_id], now)))
        return updated

    def append_tokens(self, request: Request, token_ids: Sequence[int], now: float) -> int:
        """Append new tokens to a running request, applying the token-level stops after each (a stop frees it and
        drops the tokens after it); returns how many were kept."""
        for num_kept, token_id in enumerate(token_ids, 1):
            request.append_output_token(token_id)
            request.record_token_time(now)
            stop = check_token_stop(request, self.max_model_len)
            if stop is not None:
                self.finish_request(request, *stop)
                return num_kept
        return len(token_ids)

    def _trim(self, request: Request) -> None:
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

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def check_invariants(self) -> None:
        """Queues and block holdings agree with request states; see KVCacheManager.check_invariants."""
        for request in self.running:
            assert request.status is RequestStatus.RUNNING, request
        for request in self.waiting:
            assert request.status is RequestStatus.WAITING, request
        assert len(self.running) + len(self.waiting) == len(self.requests)
        self.kv_cache_manager.check_invariants(self.requests.values())


def preemption_rank(request: Request) -> tuple[int, int]:
    """The running request with the highest rank is preempted first: lowest priority, then latest arrival."""
    return request.priority, request.arrival_order


def num_sequences_to_seat(request: Request) -> int:
    """The running seats admitting `request` takes: with n > 1 (or best_of) a request that has no token yet forks
    into all its sequences in the step that samples its first token, so it needs a seat for each. One that cannot
    have them all (more sequences than `max_num_seqs`) runs when nothing else does."""
    return request.sampling_params.num_sequences if request.num_output_tokens == 0 else 1
