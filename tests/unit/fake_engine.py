"""Drive the scheduler with a fake model: every sampled token is `token_id`."""

from __future__ import annotations

from collections.abc import Mapping

from radixlm.config import SchedulerConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.core.step import ModelRunnerOutput, SchedulerOutput
from radixlm.request import Request
from radixlm.sampling_params import SamplingParams

EOS = 2


def make_scheduler(num_blocks=64, block_size=4, max_model_len=256, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), KVCacheManager(num_blocks, block_size), max_model_len)


def make_request(request_id: str, prompt_len: int, max_tokens: int = 4, priority: int = 0, order: int = 0,
                 **params) -> Request:
    return Request(request_id, list(range(10, 10 + prompt_len)), SamplingParams(max_tokens=max_tokens, **params),
                   eos_token_ids=frozenset({EOS}), arrival_order=order, priority=priority)


def runner_output(output: SchedulerOutput, tokens: Mapping[str, list[int]] | None = None,
                  token_id: int = 7, failed_keys: list[bytes] | None = None) -> ModelRunnerOutput:
    """A stand-in worker's result: `tokens` per request (default: `token_id` for each sampling request), and a
    vector for each pooling request; `failed_keys`: block files it could not read."""
    if tokens is None:
        tokens = {request_id: [token_id] for request_id in output.sampling_request_ids}
    return ModelRunnerOutput(list(tokens), [list(t) for t in tokens.values()], [None] * len(tokens),
                             embeddings={request_id: [1.0] for request_id in output.pooling_request_ids},
                             kv_failed_keys=failed_keys or [])


def step(scheduler: Scheduler, token_id: int = 7) -> SchedulerOutput:
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(output, token_id=token_id))
    scheduler.check_invariants()
    return output


def chunk_sizes(output: SchedulerOutput) -> dict[str, int]:
    return {chunk.request_id: chunk.num_tokens for chunk in output.chunks}
