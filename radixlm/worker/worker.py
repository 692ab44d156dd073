"""ModelWorker: one step in, its sampled tokens out (`SchedulerOutput` -> `ModelRunnerOutput`).

Per step: forget the requests that left, learn the new ones, extend block tables; apply the KV block copies; run
the forward (`ModelRunner`); fork n > 1 children; sample every row (a request verifying drafts owns several rows);
keep the accepted tokens; compute the prompt logprobs asked for; pool the final hidden states of embedding requests
(every chunk of a mean-pooling one, the last of a last-pooling one) and return the vector of each whose prompt is
complete. An exception in the forward propagates (the engine fails that batch); one in a request's own work (its
sampling row, its prompt logprobs, its pooling) is returned for that request alone, and the worker drops its state
when the engine names it finished.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig
from radixlm.core.step import ModelRunnerOutput, RequestError, SchedulerOutput, TokenLogprobs
from radixlm.model.lora.adapter_file import AdapterFile
from radixlm.model.ops import direct_kernel, kernels_available
from radixlm.model.pooling import embedding_of
from radixlm.model.runner import ModelRunner
from radixlm.sample.bitmask import apply_token_bitmask_
from radixlm.sample.isolated import sample_isolated
from radixlm.sample.logprobs import prompt_logprobs
from radixlm.sample.sampler import Sampler, SamplerOutput
from radixlm.structured.bitmask import GrammarBitmask
from radixlm.worker.worker_request import WorkerRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerInfo:
    """What the engine needs to know of the worker's model and cache."""

    num_kv_blocks: int
    num_kv_slots: int
    vocab_size: int
    max_position_embeddings: int | None
    model_eos_token_ids: frozenset[int]  # named by the model's generation config and config
    hidden_size: int  # the length of an embedding
    lora_target_shapes: dict[str, tuple[int, int]] | None = None  # LoRA-adaptable projections (None: LoRA off)
    num_host_blocks: int = 0  # the host tier's blocks (0: none)
    kv_bytes_per_block: int = 0  # of this worker's cache (one rank's share under tensor parallelism)


class ModelWorker:
    """`samples=False` (tensor-parallel ranks other than 0): run the forward and keep only what it needs (block
    tables, block copies, forks' KV copies); `execute_model` then returns an empty output."""

    def __init__(self, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig,
                 tensor_parallel_size: int = 1, samples: bool = True, enable_lora: bool = False) -> None:
        self.runner = ModelRunner(model_dir, model_config, cache_config, tensor_parallel_size, enable_lora)
        self.samples = samples
        self.sampler = Sampler(self.runner.shape.vocab_size,
                               greedy_kernel=direct_kernel("greedy_tokens") if kernels_available() else None)
        self.requests: dict[str, WorkerRequest] = {}

    def info(self) -> WorkerInfo:
        model, shape = self.runner.model, self.runner.shape
        eos: set[int] = set()
        for source in (model.generation_config, model.config):
            value = getattr(source, "eos_token_id", None)
            eos.update([value] if isinstance(value, int) else value or [])
        lora = self.runner.lora
        kv_cache, host_kv = self.runner.kv_cache, self.runner.host_kv
        bytes_per_block = sum(t.element_size() * t[0].numel() for t in kv_cache.tensors()) * kv_cache.block_size
        return WorkerInfo(kv_cache.num_blocks, kv_cache.num_slots, shape.vocab_size,
                          shape.max_position_embeddings, frozenset(eos), shape.hidden_size,
                          None if lora is None else lora.target_shapes(),
                          host_kv.num_blocks if host_kv is not None else 0, bytes_per_block)

    def add_lora(self, lora_id: int, adapter: AdapterFile) -> None:
        """Load a checked LoRA adapter's weights as `lora_id` (see `radixlm.model.lora.adapters`)."""
        if self.runner.lora is None:
            raise RuntimeError("the model was loaded without LoRA support (--enable-lora)")
        self.runner.lora.add(lora_id, adapter)

    def remove_lora(self, lora_id: int) -> None:
        """Drop adapter `lora_id`'s weights (no request running it may be left)."""
        if self.runner.lora is not None:
            self.runner.lora.remove(lora_id)

    @torch.inference_mode()
    def execute_model(self, step: SchedulerOutput, grammar_bitmask: GrammarBitmask | None = None) -> ModelRunnerOutput:
        """Run one step; `grammar_bitmask` masks its constrained rows. A request whose own work fails (sampling,
        pooling, prompt logprobs) is named in the output's `errors` (its traceback logged here)."""
        self._update_states(step)
        kv_cache = self.runner.kv_cache
        transfer_seconds, failed_keys = 0.0, []
        if step.kv_transfers and self.runner.host_kv is not None:
            transfer_seconds, failed_keys = self.runner.host_kv.apply(kv_cache, step.kv_transfers)
        if not step.chunks:  # a step of tier transfers only (block files read ahead of a waiting request)
            return ModelRunnerOutput(kv_transfer_seconds=transfer_seconds, kv_failed_keys=failed_keys)
        if step.block_copies:
            kv_cache.copy_blocks(step.block_copies)
        tables = {chunk.request_id: self.requests[chunk.request_id].block_table for chunk in step.chunks}
        lora_ids = {chunk.request_id: lora_id for chunk in step.chunks
                    if (lora_id := self.requests[chunk.request_id].lora_id)}
        result = self.runner.execute(step.chunks, tables, step.prompt_logprob_positions,
                                     self._pooling_types(step) if self.samples else None, lora_ids)
        parent_rows: dict[str, int] = {}  # a sampling request -> its last logits row
        rows: list[WorkerRequest] = []
        for chunk in step.chunks:
            request = self.requests[chunk.request_id]
            if chunk.samples:
                rows.append(request)
                drafts = chunk.token_ids[chunk.num_tokens - chunk.num_draft_tokens:]
                rows += [request.draft_row(drafts[:j]) for j in range(1, chunk.num_sampled)]
                parent_rows[chunk.request_id] = len(rows) - 1
        logits = result.logits
        for fork in step.forks:  # the forward wrote the parent's partial block: copy it now
            kv_cache.copy_blocks(fork.block_copies)
            self.requests[fork.child_id] = self.requests[fork.parent_id].fork(fork)
            rows.append(self.requests[fork.child_id])
        if not self.samples:
            return ModelRunnerOutput()
        if step.forks:
            logits = logits[torch.tensor(list(range(len(logits))) +
                                         [parent_rows[fork.parent_id] for fork in step.forks])]
        sampled, row_errors = sample_isolated(self.sampler, logits, rows, _mask_for(grammar_bitmask))
        output = ModelRunnerOutput(kv_transfer_seconds=transfer_seconds, kv_failed_keys=failed_keys)
        output.errors = {rows[row].request_id: _request_error("sampling", rows[row].request_id, error)
                         for row, error in row_errors.items()}
        self._keep_tokens(step, sampled, output)
        self._prompt_logprobs(step, result.prompt_logits, output)
        self._keep_pooled(step, result.pooled, output)
        return output

    def _update_states(self, step: SchedulerOutput) -> None:
        for request_id in (*step.finished_request_ids, *step.preempted_request_ids):
            self.requests.pop(request_id, None)
        for data in step.new_requests:
            self.requests[data.request_id] = WorkerRequest.from_new(data)
        for request_id, num_blocks in step.trimmed_block_tables.items():
            if request_id in self.requests:
                del self.requests[request_id].block_table[num_blocks:]
        for chunk in step.chunks:
            self.requests[chunk.request_id].block_table.extend(chunk.new_block_ids)

    def _keep_tokens(self, step: SchedulerOutput, sampled: SamplerOutput, output: ModelRunnerOutput) -> None:
        """Per sampling request: its tokens (verified drafts, then the first token of its own) and logprobs."""
        row = 0
        spans = [(chunk.request_id, chunk.num_sampled, chunk.token_ids[chunk.num_tokens - chunk.num_draft_tokens:])
                 for chunk in step.chunks if chunk.samples]
        spans += [(fork.child_id, 1, []) for fork in step.forks]
        for request_id, num_rows, draft_token_ids in spans:
            token_ids = sampled.token_ids[row:row + num_rows]
            logprobs = sampled.logprobs[row:row + num_rows]
            row += num_rows
            num_kept = accepted_length(draft_token_ids, token_ids)
            output.request_ids.append(request_id)
            output.sampled_token_ids.append(token_ids[:num_kept])
            output.logprobs.append(None if logprobs[0] is None else logprobs[:num_kept])  # type: ignore[arg-type]
            if request_id not in output.errors:
                self.requests[request_id].all_token_ids.extend(token_ids[:num_kept])

    def _pooling_types(self, step: SchedulerOutput) -> dict[str, str]:
        """The chunks whose final hidden states the runner reduces: request id -> "mean" or "last"."""
        types = {}
        for chunk in step.chunks:
            params = self.requests[chunk.request_id].pooling_params
            if params is not None and params.pooling_type is not None and (chunk.pools or params.needs_every_position):
                types[chunk.request_id] = params.pooling_type
        return types

    def _keep_pooled(self, step: SchedulerOutput, pooled: dict[str, torch.Tensor], output: ModelRunnerOutput) -> None:
        """Fold each chunk's pooled rows into its request; a request whose prompt is complete gets its vector."""
        if not pooled:  # the usual step: no embedding request in it
            return
        for chunk in step.chunks:
            if chunk.request_id not in pooled:
                continue
            request = self.requests[chunk.request_id]
            try:
                request.add_pooled(pooled[chunk.request_id], chunk.num_tokens)
                if chunk.pools:
                    output.embeddings[chunk.request_id] = _embedding(request)
            except Exception as error:
                output.errors.setdefault(chunk.request_id, _request_error("pooling", chunk.request_id, error))

    def _prompt_logprobs(self, step: SchedulerOutput, logits: dict[str, torch.Tensor],
                         output: ModelRunnerOutput) -> None:
        for request_id, (first, end) in step.prompt_logprob_positions.items():
            request = self.requests[request_id]
            try:
                entries: list[TokenLogprobs] = prompt_logprobs(
                    logits[request_id], request.all_token_ids[first + 1:end + 1],
                    request.sampling_params.prompt_logprobs or 0)
            except Exception as error:
                output.errors.setdefault(request_id, _request_error("prompt logprobs", request_id, error))
                continue
            output.prompt_logprobs[request_id] = entries


def _request_error(phase: str, request_id: str, error: BaseException) -> RequestError:
    """A request's own failure as data for the engine, its traceback logged here (it does not cross processes)."""
    logger.error("request %s: %s failed", request_id, phase, exc_info=error)
    return RequestError.of(phase, error)


def _embedding(request: WorkerRequest) -> list[float]:
    """The vector of a pooling request whose prompt is complete (mean pooling must have seen every position)."""
    params = request.pooling_params
    assert params is not None and params.pooling_type is not None
    if params.needs_every_position and request.num_pooled_positions != request.num_prompt_tokens:
        raise RuntimeError(f"mean pooling saw {request.num_pooled_positions} of the prompt's "
                           f"{request.num_prompt_tokens} positions")
    return embedding_of(request.pooled, request.num_pooled_positions, params.pooling_type)


def accepted_length(draft_token_ids: list[int], sampled_token_ids: list[int]) -> int:
    """How many sampled tokens a request keeps: row j's token stands while every draft before it matched the token
    sampled in its place (row j was computed after draft j-1, so it is valid only if that draft was right).
    Sampling each row from the model's distribution with the sequence's own uniform number for that position,
    and keeping a draft only where it equals the sample, gives exactly the tokens plain decoding would."""
    num_kept = 1
    for draft, token in zip(draft_token_ids, sampled_token_ids, strict=False):
        if draft != token:
            break
        num_kept += 1
    return num_kept


def _mask_for(grammar: GrammarBitmask | None) -> Callable[[list[WorkerRequest]],
                                                          Callable[[torch.Tensor], None] | None]:
    """The sampler's grammar stage for a list of rows: mask the rows whose request has a bitmask this step."""
    def mask_for(rows: list[WorkerRequest]) -> Callable[[torch.Tensor], None] | None:
        if grammar is None:
            return None
        index = {key: i for i, key in enumerate(zip(grammar.request_ids, grammar.row_offsets, strict=True))}
        keys = [(request.request_id, request.num_drafts_before) for request in rows]
        pairs = [(row, index[key]) for row, key in enumerate(keys) if key in index]
        if not pairs:
            return None
        masks = grammar.bitmask[torch.tensor([i for _, i in pairs])]
        return lambda logits: apply_token_bitmask_(logits, [row for row, _ in pairs], masks)
    return mask_for
