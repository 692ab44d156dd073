"""LLMEngine: schedule -> forward -> sample -> append -> stop checks -> outputs, one step at a time.

The engine is single-threaded: callers (the offline LLM, the async server wrapper) own the loop and call
`add_request`, `abort_request` and `step` from one thread.

A user request is a `SequenceGroup`; each of its sequences is one scheduler `Request`. With n > 1 (or best_of)
sequence 0 computes the prompt, and in the step where it samples its first token the others are forked from it:
they share its prompt blocks (ref counts; a partly filled last block is copied right after the forward that
wrote it) and each draws its own first token from the same logits row, with its own random stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from radixlm.config import EngineConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.outputs import SchedulerOutput
from radixlm.core.scheduler import Scheduler
from radixlm.engine.admission import Admission, eos_token_ids, max_model_len
from radixlm.engine.grammars import GrammarTracker
from radixlm.engine.logprob_format import LogprobFormatter
from radixlm.engine.output_processor import OutputProcessor
from radixlm.engine.outputs import RequestOutput
from radixlm.engine.prompt_logprobs import prompt_logits_positions
from radixlm.model.loader import load_tokenizer, resolve_model_dir
from radixlm.model.runner import ModelRunner, RunnerOutput
from radixlm.request import Request, RequestStatus, sequence_id
from radixlm.sample.isolated import sample_isolated
from radixlm.sample.logprobs import TokenLogprobs
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams
from radixlm.structured.manager import StructuredOutputs
from radixlm.trace.recorder import TraceRecorder

logger = logging.getLogger(__name__)

# This many forward passes failing in a row mean the device (or the model) is broken, not a request.
MAX_FORWARD_FAILURES = 3


class LLMEngine:
    """Owns the tokenizer, model runner, scheduler and sampler of one model."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_dir = resolve_model_dir(config.model.model)
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(model_dir)
        self.runner = ModelRunner(model_dir, config.model, config.cache)
        self.max_model_len = max_model_len(config.model.max_model_len, self.runner.kv_cache.num_slots,
                                           self.runner.shape.max_position_embeddings)
        kv_cache_manager = KVCacheManager(self.runner.kv_cache.num_blocks, config.cache.block_size,
                                          config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, kv_cache_manager, self.max_model_len)
        self.sampler = Sampler(self.runner.shape.vocab_size)
        self.eos_token_ids = eos_token_ids(self.runner.model, self.tokenizer)
        self.model_name = config.model.served_model_name or config.model.model
        self.logprob_formatter = LogprobFormatter(self.tokenizer)
        self.structured = StructuredOutputs(self.tokenizer, self.runner.shape.vocab_size, sorted(self.eos_token_ids))
        self.grammars = GrammarTracker(self.structured)
        self.admission = Admission(config, self.tokenizer, self.runner.shape.vocab_size, self.eos_token_ids)
        self._num_failed_forwards = 0  # in a row
        self.num_steps = 0  # steps that ran a forward (or tried to)
        self.last_scheduler_output: SchedulerOutput | None = None  # for debugging tools and the dashboard
        self.last_step_seconds = 0.0
        self.tracer = TraceRecorder(config.scheduler.trace, config, self.runner.kv_cache.num_blocks,
                                    self.max_model_len, self.eos_token_ids) if config.scheduler.trace else None
        self.output_processor = OutputProcessor(self.scheduler, self.grammars, self.logprob_formatter, self.tracer)

    # -- requests ----------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | Seq[int], params: SamplingParams | None = None,
                    priority: int = 0, arrival_time: float | None = None, metadata: Mapping[str, Any] | None = None,
                    on_finish: Callable[[RequestOutput], object] | None = None) -> Request:
        """Tokenize and queue a request (all its sequences); raises ValueError for one that can never run.

        `metadata` is the caller's, returned on every output of the request. `on_finish(final_output)` runs once,
        on the engine's thread, when the request ends in any terminal state (finished, aborted, failed); an
        exception it raises is logged and harms nothing. Returns the scheduler request of its first sequence.
        """
        params = params or SamplingParams()
        self.admission.check_params(params)
        ids = [sequence_id(request_id, i) for i in range(params.num_sequences)]
        book = self.output_processor
        taken = [i for i in [request_id, *ids] if i in book.groups or i in book.sequences]
        if taken:
            raise ValueError(f"request_id {taken[0]!r} is already in use")
        group = self.admission.build_group(request_id, prompt, params, priority, arrival_time)
        group.metadata, group.on_finish = dict(metadata) if metadata else None, on_finish
        first = group.first.request
        self.scheduler.check_admissible(first, num_pending=self.grammars.num_waiting)
        queued = params.structured_outputs is None or self.grammars.submit(group)
        if queued:
            self.scheduler.add_request(first)
        if self.tracer is not None:
            self.tracer.arrival(group, queued, self.num_steps)
        book.add(group)
        return first

    def add_requests(self, requests: Iterable[tuple[str, str | Seq[int], SamplingParams | None]], priority: int = 0,
                     arrival_time: float | None = None, metadata: Mapping[str, Any] | None = None,
                     on_finish: Callable[[RequestOutput], object] | None = None) -> None:
        """`add_request` for each (request_id, prompt, params), all or nothing: if one raises, those already added
        are aborted before the error propagates."""
        requests = list(requests)
        limit = self.config.scheduler.max_queued_requests
        if limit is not None and len(requests) > limit:
            raise ValueError(f"prompt holds {len(requests)} prompts, but at most {limit} requests may wait "
                             f"(--max-queued-requests): it could never be admitted whole")
        added: list[str] = []
        try:
            for request_id, prompt, params in requests:
                self.add_request(request_id, prompt, params, priority=priority, arrival_time=arrival_time,
                                 metadata=metadata, on_finish=on_finish)
                added.append(request_id)
        except Exception:
            for request_id in added:
                self.abort_request(request_id)
            raise

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort every live sequence of a request; returns its final output, or None if it was not live."""
        group = self.output_processor.groups.get(request_id)
        if group is None:
            return None
        if self.tracer is not None:
            self.tracer.abort(request_id, self.num_steps)
        return self.output_processor.end_group(group, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self.output_processor.groups)

    # -- the loop ----------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns an output for every request that has news (see `engine/outputs.py`).

        Fault isolation: an exception that belongs to one request (its sampling row, prompt logprobs, grammar, text)
        ends that request alone with finish_reason "error"; one in the forward ends the requests of the batch.
        The others go on. Anything else (the scheduler, the invariants, `MAX_FORWARD_FAILURES` forwards failing in
        a row: a broken device) raises: the engine cannot go on.
        """
        started = time.perf_counter()
        failed = self._admit_compiled_grammars()
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            if self.grammars.num_waiting:
                self.grammars.wait(timeout=0.05)  # nothing else to do: don't spin
            return failed
        scheduled_at = time.perf_counter()
        self.last_scheduler_output = scheduler_output
        scheduled = [self.scheduler.requests[c.request_id] for c in scheduler_output.chunks] if self.tracer else []
        positions = prompt_logits_positions(scheduler_output, self.output_processor.sequences)
        result = self._forward(scheduler_output, positions, failed)
        forwarded_at = time.perf_counter()
        updated = self._sample_and_update(scheduler_output, result.logits, failed) if result is not None else []
        sampled_at = time.perf_counter()
        if result is not None:
            self.output_processor.record_prompt_logprobs(positions, result.prompt_logits, failed)
        outputs = failed + self.output_processor.outputs(self.output_processor.record_tokens(updated, failed))
        self.last_step_seconds = time.perf_counter() - started
        if self.tracer is not None:
            marks = (started, scheduled_at, forwarded_at, sampled_at, time.perf_counter())
            self.tracer.step(self.num_steps, marks, scheduler_output, scheduled, [r for r, _ in updated],
                             self.scheduler, forward_failed=result is None)
        self.num_steps += 1
        return outputs

    def _forward(self, scheduler_output: SchedulerOutput, positions: dict[str, tuple[int, int]],
                 failed: list[RequestOutput]) -> RunnerOutput | None:
        """The model's forward; if it raises, every request of the batch fails (None is returned)."""
        try:
            result = self.runner.execute(scheduler_output, positions)
        except Exception as error:
            self._num_failed_forwards += 1
            if self._num_failed_forwards >= MAX_FORWARD_FAILURES:
                raise RuntimeError(f"{MAX_FORWARD_FAILURES} forward passes failed in a row") from error
            for chunk in scheduler_output.chunks:
                self.output_processor.fail_sequence(chunk.request_id, error, "the forward pass", failed)
            self.check_invariants()
            return None
        self._num_failed_forwards = 0
        return result

    def _sample_and_update(self, scheduler_output: SchedulerOutput, logits: torch.Tensor,
                           failed: list[RequestOutput]) -> list[tuple[Request, TokenLogprobs | None]]:
        """Sample every sampling row (forked children included), append the tokens, run grammars; returns the
        requests that received a token with their logprobs."""
        parents = [self.scheduler.requests[rid] for rid in scheduler_output.sampling_request_ids]
        if not parents:
            self.scheduler.update_from_output(scheduler_output, [])
            return []
        children, child_rows = self._fork_children(scheduler_output)
        if children:
            logits = logits[torch.tensor(list(range(len(parents))) + child_rows)]
        rows = parents + children
        sampled, errors = sample_isolated(self.sampler, logits, rows, self.grammars.mask_function)
        for row, error in errors.items():
            self.output_processor.fail_sequence(rows[row].request_id, error, "sampling", failed)
        updated = self.scheduler.update_from_output(scheduler_output, sampled.token_ids[:len(parents)])
        updated += self._start_children(children, sampled.token_ids[len(parents):])
        token_logprobs = {r.request_id: lp for r, lp in zip(rows, sampled.logprobs, strict=True)}
        for request in updated:
            if request.request_id in self.output_processor.sequences:
                self.output_processor.guarded([self.output_processor.group_of(request.request_id)], "the grammar",
                                              failed, self._accept_grammar, request)
        return [(r, token_logprobs[r.request_id]) for r in updated if r.request_id in self.output_processor.sequences]

    def _accept_grammar(self, request: Request) -> None:
        if self.grammars.accept(request) and not request.is_finished:
            self.scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED)

    def _admit_compiled_grammars(self) -> list[RequestOutput]:
        """Schedule the requests whose grammar compiled since the last step; fail those whose grammar failed."""
        if not self.grammars.num_waiting:
            return []
        ready, failed_compiles = self.grammars.take_compiled()
        for group in ready:  # admitted against the queue limit when added
            self.scheduler.add_request(group.first.request, check_queue_limit=False)
            if self.tracer is not None:
                self.tracer.queued(group.request_id, self.num_steps)
        failed: list[RequestOutput] = []
        for group, error in failed_compiles:
            self.output_processor.fail(group, error, "compiling the grammar", failed)
        return failed

    def _fork_children(self, scheduler_output: SchedulerOutput) -> tuple[list[Request], list[int]]:
        """Start the unforked sequences of groups whose first sequence samples its first token in this step."""
        children: list[Request] = []
        rows: list[int] = []
        sampling_chunks = [chunk for chunk in scheduler_output.chunks if chunk.samples]
        for row, chunk in enumerate(sampling_chunks):
            group, sequence = self.output_processor.sequences[chunk.request_id]
            if sequence.index != 0 or not group.unforked:
                continue
            for child in group.unforked:
                # The forward has written the parent's K/V: copy its partial block now. (Deferring the copy to the
                # next step would let a child that ends at once free its block and someone else reuse it.)
                self.runner.kv_cache.copy_blocks(
                    self.scheduler.fork_request(sequence.request, child.request, chunk.context_len))
                if self.tracer is not None:
                    self.tracer.fork(sequence.request, child.request, chunk.context_len)
                children.append(child.request)
                rows.append(row)
            group.unforked = []
        return children, rows

    def _start_children(self, children: list[Request], token_ids: list[int]) -> list[Request]:
        """Give forked sequences their first token (what `update_from_output` does for scheduled ones); children
        of a group that failed in this step are already finished."""
        now = time.monotonic()
        started = [child for child in children if not child.is_finished]
        for child, token_id in zip(children, token_ids, strict=True):
            if not child.is_finished:
                self.scheduler.append_token(child, token_id, now)
        return started

    # -- stats -------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.scheduler.check_invariants()
        self.output_processor.check_invariants()


def build_engine(**kwargs: object) -> LLMEngine:
    """`build_engine(model=..., max_num_seqs=...)`: an engine from flat config keywords."""
    start = time.monotonic()
    engine = LLMEngine(EngineConfig.from_kwargs(**kwargs))
    logger.info("engine ready in %.1f s", time.monotonic() - start)
    return engine
