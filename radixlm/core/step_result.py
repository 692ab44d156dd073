"""apply_step_result: one step's `ModelRunnerOutput` applied inside the core, as `Scheduler.update_from_output`.

In order: the requests whose own work failed end (their user request whole); prompt logprobs of the positions
computed go to their groups; token progress advances, new tokens are appended with the token-level stops applied
after each (rejected drafts are not computed: progress stops after the last accepted one and the block table is
trimmed, so the radix tree only ever sees final tokens); each constrained sequence's grammar takes its new tokens
and may end it earlier; a pooling request whose prompt is computed finishes with its vector. Every sequence with
news gets one `RequestUpdate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from radixlm.core.step import ModelRunnerOutput, RequestError, RequestUpdate, SchedulerOutput, TokenLogprobs
from radixlm.request import Request, RequestStatus

if TYPE_CHECKING:
    from radixlm.core.scheduler import Scheduler


class GrammarAcceptor(Protocol):
    """The engine's grammars, as the core uses them (the core itself loads no grammar library)."""

    def accept(self, request_id: str, token_ids: list[int]) -> int | None:
        """Feed a sequence's new tokens to its grammar, in order; how many it took when the grammar ended (or
        refused one), else None (also for a sequence without a grammar). May raise: the sequence then fails."""


@dataclass
class _News:
    """One sequence's news while the result is applied."""

    request: Request
    num_new: int = 0
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    embedding: list[float] | None = None
    logprobs: list[TokenLogprobs] | None = None


def apply_step_result(scheduler: Scheduler, scheduler_output: SchedulerOutput,
                      runner_output: ModelRunnerOutput) -> list[RequestUpdate]:
    """See the module docstring; the updates come in the order of the sequences' first news."""
    errors = {rid: str(error) for rid, error in runner_output.errors.items()}
    errors |= _missing_embeddings(scheduler, scheduler_output, runner_output)
    updates = scheduler.fail_groups(errors)
    news: dict[str, _News] = {}
    _take_prompt_logprobs(scheduler, scheduler_output, runner_output, news)
    _advance(scheduler, scheduler_output, runner_output.tokens_by_request(), runner_output.embeddings, news)
    logprobs = dict(zip(runner_output.request_ids, runner_output.logprobs, strict=True))
    grammar_errors = {}
    for item in news.values():
        if item.num_new and scheduler.grammar is not None:
            try:
                _accept_grammar(scheduler, item)
            except Exception as error:  # the grammar's own failure: this request fails alone
                grammar_errors[item.request.request_id] = str(RequestError.of("the grammar", error))
                continue
        entries = logprobs.get(item.request.request_id)
        if item.num_new and entries is not None:
            item.logprobs = entries[:item.num_new]
    failed = scheduler.fail_groups(grammar_errors)
    updates += [_update(item) for item in news.values() if item.request.request_id not in grammar_errors]
    return updates + failed


def _missing_embeddings(scheduler: Scheduler, scheduler_output: SchedulerOutput,
                        runner_output: ModelRunnerOutput) -> dict[str, str]:
    """A pooling request the worker returned no vector for, without an error of its own, fails."""
    return {rid: str(RequestError("pooling", "RuntimeError", "the worker returned no embedding"))
            for rid in scheduler_output.pooling_request_ids
            if rid in scheduler.requests and rid not in runner_output.embeddings and rid not in runner_output.errors}


def _take_prompt_logprobs(scheduler: Scheduler, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput,
                          news: dict[str, _News]) -> None:
    for chunk in scheduler_output.chunks:
        group = scheduler.groups.get(chunk.request_id)
        if group is None or group.next_prompt_logprob is None or chunk.request_id not in scheduler.requests:
            continue
        computed = chunk.request_id in scheduler_output.prompt_logprob_positions
        if computed and chunk.request_id not in runner_output.prompt_logprobs:
            continue  # it failed
        if computed or group.num_skipped_prompt_logprobs:
            entries = runner_output.prompt_logprobs[chunk.request_id] if computed else []
            item = news.setdefault(chunk.request_id, _News(group.first))
            item.prompt_logprobs = group.take_prompt_logprobs(entries)


def _advance(scheduler: Scheduler, scheduler_output: SchedulerOutput, sampled_token_ids: dict[str, list[int]],
             embeddings: dict[str, list[float]], news: dict[str, _News]) -> None:
    """Token progress and new tokens of every chunk and fork (a request missing from `sampled_token_ids` failed
    and gets none); pooling requests whose prompt is computed finish."""
    now = time.monotonic()
    for chunk in scheduler_output.chunks:
        request = scheduler.requests.get(chunk.request_id)
        if request is None or request.status is not RequestStatus.RUNNING:
            continue  # ended while the step ran
        scheduler.num_computed_prompt_tokens += max(
            0, min(chunk.context_len, request.num_prompt_tokens) - chunk.start_position)
        token_ids = sampled_token_ids.get(chunk.request_id, ()) if chunk.samples else ()
        num_rejected = chunk.num_draft_tokens - max(0, len(token_ids) - 1) if token_ids else 0
        request.num_computed_tokens += chunk.num_tokens - num_rejected
        request.draft_token_ids = []
        if chunk.pools:  # its whole prompt is computed: the worker returned its vector, and it samples nothing
            news.setdefault(chunk.request_id, _News(request)).embedding = embeddings[chunk.request_id]
            scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED)
            continue
        if token_ids:  # before caching: accepted drafts are computed tokens the tree needs to know
            news.setdefault(chunk.request_id, _News(request)).num_new = scheduler.append_tokens(request, token_ids,
                                                                                                 now)
        if request.is_finished:
            continue  # freed: its computed tokens went to the tree
        if chunk.num_tokens > 1:
            scheduler.kv_cache_manager.cache_computed(request)  # later requests (and this one, if preempted) hit
        if num_rejected:
            scheduler.trim(request)
    for fork in scheduler_output.forks:
        child = scheduler.requests.get(fork.child_id)
        if child is not None and child.status is RequestStatus.RUNNING and fork.child_id in sampled_token_ids:
            news.setdefault(fork.child_id, _News(child)).num_new = scheduler.append_tokens(
                child, sampled_token_ids[fork.child_id], now)


def _accept_grammar(scheduler: Scheduler, item: _News) -> None:
    """Feed the new tokens to the sequence's grammar; a grammar that ends drops the tokens after its end and
    finishes the sequence."""
    request = item.request
    assert scheduler.grammar is not None
    num_outputs = request.num_output_tokens
    num_taken = scheduler.grammar.accept(request.request_id, request.all_token_ids[-item.num_new:])
    if num_taken is None:
        return
    if num_taken < item.num_new and not request.is_finished:
        request.truncate_output(num_outputs - item.num_new + num_taken)
    if not request.is_finished:
        scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED)
    item.num_new -= num_outputs - request.num_output_tokens


def _update(item: _News) -> RequestUpdate:
    request = item.request
    token_ids = request.all_token_ids[-item.num_new:] if item.num_new else []  # its newest: never the prompt
    finished = request.is_finished
    return RequestUpdate(request.request_id, token_ids, item.logprobs, item.prompt_logprobs, item.embedding,
                         request.status if finished else None, request.stop_reason if finished else None)
