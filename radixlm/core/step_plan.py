"""StepPlan: how `Scheduler.schedule` fills one step, and the preemption it does on the way.

The token budget goes first to one token for every running request that is decoding (plus its drafts where the
budget allows: drafts never take the token of another decode), then to prefill chunks of running requests part-way
through their prompt, then to new chunks for waiting requests, each starting from its cached prefix. When blocks
run out a running request is preempted by recompute: the victim (lowest priority, then latest arrival) frees its
blocks, forgets its computed tokens, keeps its generated ones and goes back to the front of the waiting queue.
Under the priority policy a waiting request also preempts running ones of strictly lower priority when blocks or
`max_num_seqs` run out. Groups whose first sequence samples its first token fork their other sequences, and the
prompt positions whose logprobs are due are named, so the worker needs nothing but the finished `SchedulerOutput`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.core.prefix_policy import (
    InFlightPrefill,
    duplicates_in_flight_prefill,
    order_by_cached_prefix,
    reuses_prefix_cache,
)
from radixlm.core.step import ForkedRequest, NewRequestData, ScheduledChunk, SchedulerOutput
from radixlm.core.token_stops import drafts_within_limits
from radixlm.request import Request, RequestStatus

if TYPE_CHECKING:
    from radixlm.core.scheduler import Scheduler


class StepPlan:
    """One step being filled: the scheduler it changes (queues, block tables, preemptions), the chunks chosen so
    far and what the worker must apply besides. `build()` once."""

    def __init__(self, scheduler: Scheduler, finished_request_ids: list[str],
                 trimmed_block_tables: dict[str, int]) -> None:
        self.scheduler = scheduler
        self.scheduled: dict[str, ScheduledChunk] = {}
        self.finished_request_ids = finished_request_ids
        self.trimmed_block_tables = trimmed_block_tables
        self.new_requests: list[NewRequestData] = []
        self.preempted_request_ids: list[str] = []
        self.preemption_reasons: list[str] = []
        self.block_copies: list[tuple[int, int, int]] = []
        self.forks: list[ForkedRequest] = []

    def build(self) -> SchedulerOutput:
        scheduler = self.scheduler
        budget = self._schedule_running(scheduler.config.max_num_batched_tokens)
        if not self.preempted_request_ids:
            self._schedule_waiting(budget)
        chunks = list(self.scheduled.values())
        self._fork_groups(chunks)  # its allocations may evict, and so offload: before the transfers are taken
        transfers = scheduler.kv_cache_manager.take_transfers()
        if not chunks and not scheduler.running and scheduler.waiting and not self.preempted_request_ids \
                and not (transfers and transfers.disk_reads):
            raise RuntimeError(f"scheduler made no progress with {len(scheduler.waiting)} waiting requests and "
                               f"nothing running (first: {scheduler.waiting.peek()!r}); this is a bug")
        positions = {}
        for chunk in chunks:
            group = scheduler.group_of(chunk.request_id)
            span = group.prompt_logprob_positions(chunk) if group is not None else None
            if span is not None:
                positions[chunk.request_id] = span
        return SchedulerOutput(chunks=chunks, new_requests=self.new_requests,
                               finished_request_ids=self.finished_request_ids,
                               trimmed_block_tables=self.trimmed_block_tables,
                               preempted_request_ids=self.preempted_request_ids,
                               preemption_reasons=self.preemption_reasons, block_copies=self.block_copies,
                               forks=self.forks, prompt_logprob_positions=positions,
                               kv_transfers=transfers)

    def _schedule_running(self, budget: int) -> int:
        """Decodes first, then prefill chunks of running requests; returns the budget left."""
        scheduler = self.scheduler
        decoding = [r for r in scheduler.running if r.num_uncomputed_tokens == 1]
        prefilling = [r for r in scheduler.running if r.num_uncomputed_tokens > 1]
        draft_budget = max(0, budget - len(decoding))  # drafts never take the token of another decode
        for request in decoding + prefilling:
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_drafts = min(len(drafts_within_limits(request, scheduler.max_model_len)), draft_budget)
            request.draft_token_ids = request.draft_token_ids[:num_drafts]
            num_new = min(request.num_uncomputed_tokens + num_drafts, budget)
            if num_new == 0:
                break
            while not scheduler.kv_cache_manager.allocate_slots(request, num_new):
                if num_drafts:  # speculation backs off before anyone is preempted
                    request.draft_token_ids, num_drafts = [], 0
                    num_new = min(request.num_uncomputed_tokens, budget)
                    continue
                victim = max(scheduler.running, key=preemption_rank)
                budget += self._preempt(victim, f"out of KV blocks for {request.request_id}")
                if victim is request:
                    break
            else:
                self.scheduled[request.request_id] = self._chunk(request, num_new)
                budget -= num_new
                draft_budget -= num_drafts
        return budget

    def _schedule_waiting(self, budget: int) -> None:
        """Admit waiting requests in queue order, each starting from its cached prefix."""
        scheduler = self.scheduler
        if not scheduler.waiting:
            return
        kv = scheduler.kv_cache_manager
        if (scheduler.config.schedule_policy == "lpm" and kv.radix_cache is not None
                and len(scheduler.waiting) <= scheduler.config.lpm_fallback_queue_len):
            scheduler.waiting.reorder(order_by_cached_prefix(list(scheduler.waiting), kv))
        in_flight = [InFlightPrefill(scheduler.requests[c.request_id].all_token_ids, c.start_position, c.context_len,
                                     scheduler.requests[c.request_id].lora_id)
                     for c in self.scheduled.values() if c.num_tokens > 1] if kv.radix_cache is not None else []
        for request in list(scheduler.waiting):
            if budget == 0:
                break
            reuse_cache = reuses_prefix_cache(request)  # not with prompt logprobs or mean pooling
            if reuse_cache and kv.prefetch(request):
                continue  # its prefix's block files are being read into the host tier: next step it hits
            if (freed := self._make_seats(request)) is None:
                break
            budget += freed
            match = kv.match_prefix(request) if reuse_cache else None
            num_cached = match.num_tokens if match else 0
            if reuse_cache and in_flight and kv.radix_cache is not None and \
                    duplicates_in_flight_prefill(request, num_cached, in_flight):
                continue  # next step its prefix is in the tree
            num_new = min(request.num_tokens - num_cached, budget)
            admitted = kv.allocate_with_prefix(request, match, num_new, self.block_copies)
            while not admitted and (freed := self._preempt_lower_priority(request)) is not None:
                budget += freed
                admitted = kv.allocate_with_prefix(request, match, num_new, self.block_copies)
            if not admitted and match is not None and not scheduler.running:
                # Alone and still short: the matched path also pins the copies the tree keeps where branches start
                # inside a block. Starting from nothing lets eviction free the whole tree, and it always fits.
                match, num_new = None, min(request.num_tokens, budget)
                admitted = kv.allocate_with_prefix(request, None, num_new, self.block_copies)
            if not admitted:
                break
            chunk = self._admit(request, num_new)
            budget -= num_new
            if num_new > 1:
                in_flight.append(InFlightPrefill(request.all_token_ids, chunk.start_position, chunk.context_len,
                                                 request.lora_id))

    def _admit(self, request: Request, num_new: int) -> ScheduledChunk:
        """A waiting request whose blocks are allocated starts running with its first chunk."""
        scheduler = self.scheduler
        first_admission = request.times.first_scheduled is None
        scheduler.waiting.remove(request)
        request.num_blocks_sent = 0  # new to the worker (again, after a preemption)
        self.new_requests.append(NewRequestData.of(request))
        request.transition(RequestStatus.RUNNING)
        scheduler.running.append(request)
        if first_admission:
            scheduler.kv_cache_manager.record_admission(request)
        chunk = self.scheduled[request.request_id] = self._chunk(request, num_new)
        return chunk

    def _make_seats(self, request: Request) -> int | None:
        """Make room within `max_num_seqs` for all of `request`'s sequences (preempting lower-priority ones under
        the priority policy). Returns the budget the victims' chunks give back, or None if there is no room."""
        scheduler = self.scheduler
        num_seats = num_sequences_to_seat(request)
        freed = 0
        while scheduler.running and \
                sum(map(num_sequences_to_seat, scheduler.running)) + num_seats > scheduler.config.max_num_seqs:
            victim_budget = self._preempt_lower_priority(request)
            if victim_budget is None:
                return None
            freed += victim_budget
        return freed

    def _preempt_lower_priority(self, request: Request) -> int | None:
        """Priority policy: make room for `request` by preempting the lowest-priority running request, if that one
        ranks strictly below it. Returns the budget the victim's chunk gives back, or None if nobody ranks below."""
        scheduler = self.scheduler
        if scheduler.config.schedule_policy != "priority" or not scheduler.running:
            return None
        victim = max(scheduler.running, key=preemption_rank)
        if victim.priority <= request.priority:
            return None
        return self._preempt(victim, f"priority: {request.request_id} (priority {request.priority}) needed room")

    def _preempt(self, victim: Request, reason: str) -> int:
        """Preempt `victim` by recompute, dropping its chunk from this step; returns the budget that chunk gives
        back."""
        scheduler = self.scheduler
        scheduler.running.remove(victim)
        scheduler.kv_cache_manager.free(victim)
        victim.num_computed_tokens = 0
        victim.draft_token_ids = []
        victim.transition(RequestStatus.PREEMPTED)
        victim.transition(RequestStatus.WAITING)
        scheduler.waiting.add_preempted(victim)
        scheduler.num_preemptions += 1
        self.preempted_request_ids.append(victim.request_id)
        self.preemption_reasons.append(reason)
        chunk = self.scheduled.pop(victim.request_id, None)
        return chunk.num_tokens if chunk else 0

    def _chunk(self, request: Request, num_new: int) -> ScheduledChunk:
        """The next `num_new` tokens of `request` (its drafts after its own tokens, when it reaches them)."""
        start = request.num_computed_tokens
        token_ids = request.all_token_ids[start:start + num_new]
        num_sampled = 0
        reaches_end = start + num_new >= request.num_tokens
        if reaches_end and request.pooling_params is None:
            drafts = drafts_within_limits(request, self.scheduler.max_model_len)[:start + num_new - request.num_tokens]
            token_ids += drafts
            num_sampled = 1 + len(drafts)
        new_block_ids = request.block_table[request.num_blocks_sent:]
        request.num_blocks_sent = len(request.block_table)
        return ScheduledChunk(request.request_id, token_ids, start, new_block_ids, num_sampled,
                              pools=reaches_end and request.pooling_params is not None)

    def _fork_groups(self, chunks: list[ScheduledChunk]) -> None:
        """Start the unforked sequences of each group whose first sequence samples its first token in this step:
        running, sharing the K/V of its prompt, and given their first token by `update_from_output` (see
        `ForkedRequest` and KVCacheManager.fork)."""
        scheduler = self.scheduler
        for chunk in chunks:
            group = scheduler.groups.get(chunk.request_id)
            if group is None or not group.unforked or not chunk.samples:
                continue
            parent = group.first
            for child in group.unforked:
                copies = scheduler.kv_cache_manager.fork(parent, child, parent.num_tokens)
                child.transition(RequestStatus.RUNNING)
                scheduler.running.append(child)
                scheduler.requests[child.request_id] = child
                child.num_blocks_sent = len(child.block_table)
                self.forks.append(ForkedRequest(parent.request_id, child.request_id, child.sampling_seed,
                                                list(child.block_table), copies))
            group.unforked = []


def preemption_rank(request: Request) -> tuple[int, int]:
    """The running request with the highest rank is preempted first: lowest priority, then latest arrival."""
    return request.priority, request.arrival_order


def num_sequences_to_seat(request: Request) -> int:
    """The running seats admitting `request` takes: with n > 1 (or best_of) a request that has no token yet forks
    into all its sequences in the step that samples its first token, so it needs a seat for each. One that cannot
    have them all (more sequences than `max_num_seqs`) runs when nothing else does."""
    return request.sampling_params.num_sequences if request.num_output_tokens == 0 else 1
