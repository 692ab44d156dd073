"""LLMEngine: schedule -> forward -> sample -> append -> stop checks -> outputs, one step at a time.

The engine is single-threaded: callers (the offline LLM, the async server wrapper) own the loop and call
`add_request`, `abort_request` and `step` from one thread.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from radixlm.config import EngineConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.engine.detokenizer import IncrementalDetokenizer
from radixlm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from radixlm.model.loader import load_tokenizer, resolve_model_dir
from radixlm.model.runner import ModelRunner
from radixlm.request import Request
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    """Owns the tokenizer, model runner, scheduler and sampler of one model."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_dir = resolve_model_dir(config.model.model)
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(model_dir)
        self.runner = ModelRunner(model_dir, config.model, config.cache)
        self.max_model_len = self._max_model_len()
        kv_cache_manager = KVCacheManager(self.runner.kv_cache.num_blocks, config.cache.block_size,
                                          config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, kv_cache_manager, self.max_model_len)
        self.sampler = Sampler(config.model.seed)
        self.eos_token_ids = self._eos_token_ids()
        self.model_name = config.model.served_model_name or config.model.model
        self._arrival_counter = itertools.count()
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._prompts: dict[str, str | None] = {}

    def _max_model_len(self) -> int:
        limits = [self.runner.kv_cache.num_slots]
        if self.runner.shape.max_position_embeddings:
            limits.append(self.runner.shape.max_position_embeddings)
        if self.config.model.max_model_len is not None:
            limits.append(self.config.model.max_model_len)
        max_model_len = min(limits)
        if self.config.model.max_model_len and max_model_len < self.config.model.max_model_len:
            logger.warning("max_model_len capped at %d tokens (KV cache capacity or model limit)", max_model_len)
        return max_model_len

    def _eos_token_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.runner.model.generation_config, self.runner.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            ids.update([value] if isinstance(value, int) else value or [])
        return frozenset(ids)

    # -- requests ----------------------------------------------------------------------------------------------
    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        token_ids = list(prompt)
        vocab_size = self.runner.shape.vocab_size
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab_size}), got {bad[0]!r}")
        return token_ids

    def add_request(self, request_id: str, prompt: str | Sequence[int], params: SamplingParams | None = None,
                    priority: int = 0, arrival_time: float | None = None) -> Request:
        """Tokenize and queue a request; raises ValueError for a prompt that can never run."""
        params = params or SamplingParams()
        prompt_token_ids = self.tokenize(prompt)
        request = Request(request_id, prompt_token_ids, params, eos_token_ids=self.eos_token_ids,
                          arrival_order=next(self._arrival_counter), priority=priority, arrival_time=arrival_time)
        self.scheduler.add_request(request)
        self._detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, prompt_token_ids,
                                                                params.skip_special_tokens)
        self._prompts[request_id] = prompt if isinstance(prompt, str) else None
        return request

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a live request in any state; returns its final output, or None if it was not live."""
        request = self.scheduler.requests.get(request_id)
        if request is None or not self.scheduler.abort(request_id):
            return None
        return self._make_output(request, [], "")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- the loop ----------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns an output for every request that received a token or finished."""
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        logits = self.runner.execute(scheduler_output)
        sampling_requests = [self.scheduler.requests[rid] for rid in scheduler_output.sampling_request_ids]
        sampled = self.sampler(logits, sampling_requests)
        updated = self.scheduler.update_from_output(scheduler_output, sampled)
        outputs = []
        for request in updated:
            token_id = request.last_token_id
            delta_text = self._detokenizers[request.request_id].add(token_id)
            outputs.append(self._make_output(request, [token_id], delta_text))
        return outputs

    def _make_output(self, request: Request, delta_token_ids: list[int], delta_text: str) -> RequestOutput:
        detokenizer = self._detokenizers[request.request_id]
        finished = request.is_finished
        completion = CompletionOutput(index=0, text=detokenizer.text, token_ids=request.output_token_ids,
                                      finish_reason=request.status.finish_reason, stop_reason=request.stop_reason,
                                      delta_text=delta_text, delta_token_ids=delta_token_ids)
        times = request.times
        metrics = RequestMetrics(arrival_time=times.arrival, queue_time=times.queue_time, ttft=times.ttft,
                                 e2e=times.e2e, num_preemptions=request.num_preemptions)
        output = RequestOutput(request_id=request.request_id, prompt=self._prompts[request.request_id],
                               prompt_token_ids=request.prompt_token_ids, outputs=[completion], finished=finished,
                               metrics=metrics, num_cached_tokens=request.num_cached_tokens)
        if finished:
            del self._detokenizers[request.request_id]
            del self._prompts[request.request_id]
        return output

    # -- stats -------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.scheduler.check_invariants()


def build_engine(**kwargs: object) -> LLMEngine:
    """`build_engine(model=..., max_num_seqs=...)`: an engine from flat config keywords."""
    start = time.monotonic()
    engine = LLMEngine(EngineConfig.from_kwargs(**kwargs))
    logger.info("engine ready in %.1f s", time.monotonic() - start)
    return engine
