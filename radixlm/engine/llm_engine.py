"""LLMEngine: the engine core's loop, one step at a time: schedule -> execute -> update, then outputs.

The engine is single-threaded: callers (the offline LLM, the async server wrapper) own the loop and call
`add_request`, `abort_request` and `step` from one thread.

A step (`step`): the scheduler builds the step (`SchedulerOutput`, see `radixlm/core/step.py`: chunks, forks of
n > 1 sequences, prompt-logprob positions); the grammar tracker masks the constrained rows (sent beside it); the
model worker runs it and returns the new tokens (`ModelRunnerOutput`); the scheduler applies the whole result
(token progress, token stops, grammars' ends, failures) and returns each sequence's news (`RequestUpdate`); the
output processor turns them into text, logprobs and `RequestOutput`s, and the stop strings it finds go back to the
scheduler. Every change to a request happens in the core.

A user's request is a `ParentRequest` (`engine/parent_request.py`); each of its n sequences is one core `Request`
(a child request). With n > 1 (or best_of) child 0 computes the prompt, and in the step where it samples its first
token the others are forked from it: they share its prompt blocks and each draws its own first token from the same
logits row, with its own stream. An embedding request (`PoolingParams` instead of `SamplingParams`) is one core
request that computes its prompt like any prefill and finishes with its pooled vector, generating nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as Seq
from typing import Any

from transformers import PreTrainedTokenizerBase

from radixlm.config import EngineConfig
from radixlm.core.scheduler import Scheduler
from radixlm.core.step import ModelRunnerOutput, RequestError, RequestUpdate, SchedulerOutput
from radixlm.engine.admission import Admission, eos_token_ids, max_model_len
from radixlm.engine.grammars import GrammarTracker
from radixlm.engine.kv_tiers import build_kv_cache_manager, persist_kv_tiers
from radixlm.engine.logprob_formatter import LogprobFormatter
from radixlm.engine.lora_registry import LoRARegistry
from radixlm.engine.output_processor import OutputProcessor
from radixlm.engine.trace_recorder import TraceRecorder
from radixlm.errors import ParamError
from radixlm.lora_request import LoRARequest
from radixlm.model.loader import load_tokenizer, resolve_model_dir
from radixlm.model.runner import ModelRunner
from radixlm.outputs import RequestOutput
from radixlm.pooling_params import PoolingParams
from radixlm.request import Request, RequestStatus, child_request_id
from radixlm.sampling_params import SamplingParams
from radixlm.speculative.drafter import NgramDrafter
from radixlm.structured.bitmask import GrammarBitmask
from radixlm.structured.manager import StructuredOutputs
from radixlm.worker.process import WorkerDiedError, WorkerProcess
from radixlm.worker.start import start_worker
from radixlm.worker.worker import ModelWorker

logger = logging.getLogger(__name__)

# This many forward passes failing in a row mean the device (or the model) is broken, not a request.
MAX_FORWARD_FAILURES = 3


class LLMEngine:
    """Owns the tokenizer, model runner, scheduler and sampler of one model.

    Fault isolation: an exception that belongs to one request (its sampling row, prompt logprobs, grammar, text)
    ends that request alone with finish_reason "error"; one in the forward ends the requests of the batch. The
    others go on. Anything else (the scheduler, the invariants, `MAX_FORWARD_FAILURES` forwards failing in a row: a
    broken device) raises from `step`: the engine cannot go on.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_dir = resolve_model_dir(config.model.model)
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(model_dir)
        self.worker: ModelWorker | WorkerProcess = start_worker(model_dir, config)
        self.worker_info = info = self.worker.info()
        self.max_model_len = max_model_len(config.model.max_model_len, info.num_kv_slots,
                                           info.max_position_embeddings)
        kv_cache_manager = build_kv_cache_manager(config, info, model_dir)
        self.eos_token_ids = eos_token_ids(info.model_eos_token_ids, self.tokenizer)
        self.model_name = config.model.served_model_name or config.model.model
        self.logprob_formatter = LogprobFormatter(self.tokenizer)
        self.structured = StructuredOutputs(self.tokenizer, info.vocab_size, sorted(self.eos_token_ids),
                                            config.cache.grammar_cache_num_bytes)
        self.grammars = GrammarTracker(self.structured)
        self.scheduler = Scheduler(config.scheduler, kv_cache_manager, self.max_model_len, grammar=self.grammars)
        self.admission = Admission(config, self.tokenizer, info.vocab_size, self.eos_token_ids)
        self.loras = LoRARegistry(config.lora, self.worker, info.lora_target_shapes,
                                  lambda: (request.lora_id for request in self.scheduler.requests.values()),
                                  kv_cache_manager.drop_namespace)
        for name, path in config.lora.modules:
            self.loras.load(name, path)
        self._num_failed_forwards = 0  # in a row
        self.num_steps = 0  # steps that ran a forward (or tried to)
        self.last_scheduler_output: SchedulerOutput | None = None  # for debugging tools and the dashboard
        self.last_step_seconds = 0.0
        self.kv_transfer_seconds = 0.0  # host-tier copies, all steps together (metrics: mean load latency)
        self.num_kv_transfer_steps = 0
        self.tracer = TraceRecorder(config.scheduler.trace, config, info.num_kv_blocks, self.max_model_len,
                                    self.eos_token_ids, info.num_host_blocks) if config.scheduler.trace else None
        self.output_processor = OutputProcessor(self.grammars, self.logprob_formatter, self.tracer)
        speculative = config.scheduler.speculative
        self.drafter = NgramDrafter(speculative) if speculative is not None else None

    @property
    def runner(self) -> ModelRunner:
        """The model runner, when the worker runs in this process."""
        if not isinstance(self.worker, ModelWorker):
            raise AttributeError("the model worker runs in another process")
        return self.worker.runner

    # -- requests ----------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | Seq[int], params: SamplingParams | PoolingParams | None = None,
                    priority: int = 0, arrival_time: float | None = None, metadata: Mapping[str, Any] | None = None,
                    on_finish: Callable[[RequestOutput], object] | None = None,
                    lora_request: LoRARequest | None = None) -> Request:
        """Tokenize and queue a request (all its sequences; PoolingParams: an embedding request), with LoRA adapter
        `lora_request` (loaded first if new, see `LoRARegistry.resolve`); raises ValueError for one that can never
        run.

        `metadata` is the caller's, returned on every output of the request. `on_finish(final_output)` runs once,
        on the engine's thread, when the request ends in any terminal state (finished, aborted, failed); an
        exception it raises is logged and harms nothing. Returns the scheduler request of its first sequence.
        """
        params = params or SamplingParams()
        pools = isinstance(params, PoolingParams)
        if not pools:
            self.admission.check_params(params)
        ids = [child_request_id(request_id, i) for i in range(1 if pools else params.num_sequences)]
        book = self.output_processor
        taken = [i for i in [request_id, *ids] if i in book.parents or i in book.states]
        if taken:
            raise ParamError("request_id", f"{taken[0]!r} is already in use")
        parent = self.admission.build_parent(request_id, prompt, params, priority, arrival_time,
                                             self.loras.resolve(lora_request))
        parent.metadata, parent.on_finish = dict(metadata) if metadata else None, on_finish
        first = parent.first.request
        self.scheduler.check_admissible(first)  # before its grammar is compiled
        queued = pools or params.structured_outputs is None or self.grammars.submit(parent)
        self.scheduler.add_request(first, [state.request for state in parent.children[1:]], held=not queued)
        if self.tracer is not None:
            self.tracer.arrival(parent, queued, self.num_steps)
        book.add(parent)
        return first

    def add_requests(self, requests: Iterable[tuple[str, str | Seq[int], SamplingParams | PoolingParams | None]],
                     priority: int = 0, arrival_time: float | None = None, metadata: Mapping[str, Any] | None = None,
                     on_finish: Callable[[RequestOutput], object] | None = None,
                     lora_request: LoRARequest | Seq[LoRARequest | None] | None = None) -> None:
        """`add_request` for each (request_id, prompt, params), all or nothing: if one raises, those already added
        are aborted before the error propagates. `lora_request`: one for all, or one per request."""
        requests = list(requests)
        limit = self.config.scheduler.max_queued_requests
        if limit is not None and len(requests) > limit:
            raise ParamError("prompt", f"holds {len(requests)} prompts, but at most {limit} requests may wait "
                             f"(--max-queued-requests): it could never be admitted whole")
        added: list[str] = []
        try:
            loras = [lora_request] * len(requests) if lora_request is None or isinstance(lora_request, LoRARequest) \
                else list(lora_request)
            for (request_id, prompt, params), lora in zip(requests, loras, strict=True):
                self.add_request(request_id, prompt, params, priority=priority, arrival_time=arrival_time,
                                 metadata=metadata, on_finish=on_finish, lora_request=lora)
                added.append(request_id)
        except Exception:
            for request_id in added:
                self.abort_request(request_id)
            raise

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort every live sequence of a request; returns its final output, or None if it was not live."""
        if request_id not in self.output_processor.parents:
            return None
        if self.tracer is not None:
            self.tracer.abort(request_id, self.num_steps)
        self._record(self.scheduler.finish_group(request_id, RequestStatus.FINISHED_ABORTED))
        return self.output_processor.take_output(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.output_processor.parents)

    # -- the loop ----------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns an output for every request that has news (see `engine/outputs.py`).
        Fault isolation: see the class docstring."""
        marks = [time.perf_counter()]
        self._release_compiled_grammars()
        scheduler_output = self.scheduler.schedule(self.drafter.propose(self.scheduler.running)
                                                   if self.drafter is not None else None)
        if scheduler_output.is_empty:
            if self.grammars.num_waiting:
                self.grammars.wait(timeout=0.05)  # nothing else to do: don't spin
            return self.output_processor.take_outputs()
        self.last_scheduler_output = scheduler_output
        scheduled = self._scheduled_requests(scheduler_output) if self.tracer is not None else []
        bitmask = self._grammar_bitmask(scheduler_output)
        marks.append(time.perf_counter())
        runner_output = self._execute(scheduler_output, bitmask)
        marks.append(time.perf_counter())
        updates = self.scheduler.update_from_output(scheduler_output, runner_output)
        self._record(updates)
        marks.append(time.perf_counter())
        outputs = self.output_processor.take_outputs()
        self._trace_step(marks, scheduler_output, scheduled, updates)
        return outputs

    def _record(self, updates: list[RequestUpdate]) -> None:
        """The core's news to the output processor; the stop strings it finds, and the requests whose text work
        raised, back to the core (whose resulting ends come back here)."""
        stops, failures = self.output_processor.record(updates)
        self.scheduler.apply_stops(stops)
        if failures:
            self._record(self.scheduler.fail_groups(failures))

    def _grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarBitmask | None:
        """The masks of this step's constrained rows; a sequence whose matcher raises fails (its row is left out)."""
        drafts = {c.request_id: c.token_ids[c.num_tokens - c.num_draft_tokens:]
                  for c in scheduler_output.chunks if c.num_draft_tokens}
        errors: dict[str, str] = {}
        bitmask = self.grammars.bitmask(scheduler_output.sampling_request_ids, drafts, lambda request_id, error:
                                        errors.setdefault(request_id, str(RequestError.of("the grammar", error))))
        self._record(self.scheduler.fail_groups(errors))
        return bitmask

    def _execute(self, scheduler_output: SchedulerOutput, bitmask: GrammarBitmask | None) -> ModelRunnerOutput:
        """The worker's step. If it raises, every request of the batch fails, and the result is empty."""
        try:
            result = self.worker.execute_model(scheduler_output, bitmask)
        except WorkerDiedError:
            raise  # not this batch's fault: no worker is left to run another
        except Exception as error:
            self._num_failed_forwards += 1
            if self._num_failed_forwards >= MAX_FORWARD_FAILURES:
                raise RuntimeError(f"{MAX_FORWARD_FAILURES} forward passes failed in a row") from error
            logger.error("the forward pass failed", exc_info=error)
            failed = str(RequestError.of("the forward pass", error))
            request_ids = scheduler_output.sampling_request_ids + [c.request_id for c in scheduler_output.chunks]
            self._record(self.scheduler.fail_groups(dict.fromkeys(request_ids, failed)))
            if scheduler_output.kv_transfers:  # the tree may name blocks whose loads never ran, the host tier
                self.scheduler.kv_cache_manager.cancel_transfers()  # blocks whose files were never read
                self.scheduler.kv_cache_manager.reset_prefix_cache()
            self.check_invariants()
            return ModelRunnerOutput()
        self._num_failed_forwards = 0
        if scheduler_output.kv_transfers:
            self.kv_transfer_seconds += result.kv_transfer_seconds
            self.num_kv_transfer_steps += 1
        if self.drafter is not None:
            self.drafter.record(scheduler_output, result.tokens_by_request())
        return result

    def _release_compiled_grammars(self) -> None:
        """Queue the requests whose grammar compiled since the last step; fail those whose grammar failed."""
        if not self.grammars.num_waiting:
            return
        ready, failed_compiles = self.grammars.take_compiled()
        for parent in ready:  # admitted against the queue limit when added
            self.scheduler.release(parent.request_id)
            if self.tracer is not None:
                self.tracer.queued(parent.request_id, self.num_steps)
        self._record(self.scheduler.fail_groups({parent.request_id: str(RequestError.of("compiling the grammar", error))
                                                 for parent, error in failed_compiles}))

    def _scheduled_requests(self, scheduler_output: SchedulerOutput) -> list[Request]:
        """The sequences of this step's chunks and forks (for the trace)."""
        ids = [c.request_id for c in scheduler_output.chunks] + [f.child_id for f in scheduler_output.forks]
        return [self.scheduler.requests[request_id] for request_id in ids if request_id in self.scheduler.requests]

    def _trace_step(self, marks: list[float], scheduler_output: SchedulerOutput, scheduled: list[Request],
                    updates: list[RequestUpdate]) -> None:
        self.last_step_seconds = time.perf_counter() - marks[0]
        if self.tracer is not None:
            self.tracer.step(self.num_steps, (*marks, time.perf_counter()), scheduler_output, scheduled,
                             [(u.request_id, u.new_token_ids) for u in updates if u.new_token_ids],
                             self.scheduler, forward_failed=self._num_failed_forwards > 0)
        self.num_steps += 1

    # -- stats -------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.scheduler.check_invariants()
        self.output_processor.check_invariants(self.scheduler.is_live)

    def check_health(self) -> None:
        """Raise WorkerDiedError if the worker runs in other processes and one of them has exited."""
        if isinstance(self.worker, WorkerProcess):
            self.worker.check_health()

    def close(self) -> None:
        """Save the cached prefixes to the disk tier (if any), then stop the worker process, if the worker runs in
        one."""
        persist_kv_tiers(self)
        if isinstance(self.worker, WorkerProcess):
            self.worker.close()


def build_engine(**kwargs: object) -> LLMEngine:
    """`build_engine(model=..., max_num_seqs=...)`: an engine from flat config keywords."""
    start = time.monotonic()
    engine = LLMEngine(EngineConfig.from_kwargs(**kwargs))
    logger.info("engine ready in %.1f s", time.monotonic() - start)
    return engine
