"""The step contract: what the engine core sends the model worker each step, and what comes back. Plain data.

One step is `SchedulerOutput` in, `ModelRunnerOutput` out: the scheduler alone builds the first (frozen), and
`Scheduler.update_from_output` applies the whole second inside the core, returning a `RequestUpdate` per request
with news for the output processor. Beside the step travels only the grammar bitmask of its constrained rows
(`radixlm/structured/bitmask.py`), so that this module stays plain data: a worker in another process needs only
these to pickle (`radixlm/worker/process.py`); a failure crosses as data too (`RequestError`).

The worker keeps its own state per request (token ids, sampling parameters and random stream, block table),
created when a request first appears (`NewRequestData`,
or `ForkedRequest` for sequences 1.. of n > 1) and updated by deltas: each `ScheduledChunk` carries only the tokens
it computes and the blocks added since the worker last saw the request; requests that left (finished, aborted,
failed, preempted) are named once and forgotten. So a running decode costs a few dozen bytes a step.

Token progress (see `radixlm/request.py`): a chunk computes positions `start_position .. context_len - 1`. When it
reaches the end of the request's tokens it samples: `num_sampled` rows, the last ones of the chunk. With draft
tokens (speculative decoding) the chunk ends with `num_sampled - 1` drafts; row j verifies draft j, and the worker
returns the drafts it accepted followed by one token of its own. A pooling request (an embedding, `PoolingParams`)
never samples: the chunk that reaches the end of its prompt `pools`, and the worker returns the request's vector
instead of a token (`ModelRunnerOutput.embeddings`); the scheduler then finishes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.core.host_tier import KVTransfers
from radixlm.pooling_params import PoolingParams
from radixlm.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledChunk:
    """The tokens of one request whose K/V this step computes (`token_ids`, drafts included, at positions
    `start_position ..`); `new_block_ids` extend the worker's block table of the request (its whole table when the
    request is new to the worker); the logits of the last `num_sampled` positions are sampled (0: a prefill chunk
    that does not reach the end of the prompt, or any chunk of a pooling request). `pools`: the chunk completes a
    pooling request's prompt, so the worker returns its pooled vector."""

    request_id: str
    token_ids: list[int]
    start_position: int
    new_block_ids: list[int]
    num_sampled: int
    pools: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_position + len(self.token_ids)

    @property
    def samples(self) -> bool:
        return self.num_sampled > 0

    @property
    def num_draft_tokens(self) -> int:
        return max(0, self.num_sampled - 1)


@dataclass(slots=True)
class NewRequestData:
    """Everything the worker keeps about a request, sent on its first schedule (and again after a preemption):
    its tokens so far, its sampling parameters as `SamplingParams.to_dict()`, its random stream's seed and the
    token ids that end it (min_tokens bans them); the pooling parameters of an embedding request (None otherwise);
    the LoRA adapter it runs with (`lora_id`, loaded in the worker beforehand; 0: the base model)."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: dict[str, Any]
    sampling_seed: int
    eos_token_ids: list[int]
    pooling_params: PoolingParams | None = None
    lora_id: int = 0

    @classmethod
    def of(cls, request: Request) -> NewRequestData:
        return cls(request.request_id, list(request.all_token_ids), request.num_prompt_tokens,
                   request.sampling_params.to_dict(), request.sampling_seed, sorted(request.eos_token_ids),
                   request.pooling_params, request.lora_id)


@dataclass(slots=True)
class ForkedRequest:
    """Sequence `child_id` of an n > 1 request starts from `parent_id`'s prompt in this step: after the forward
    the worker copies `block_copies` (the parent's partly filled last block, written by this forward), gives the
    child `block_ids`, and samples the child's first token from the parent's last logits row with its own seed."""

    parent_id: str
    child_id: str
    sampling_seed: int
    block_ids: list[int]
    block_copies: list[tuple[int, int, int]]


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's work, decided by the scheduler alone: the chunks to run (decodes first), what it did on the way,
    and what the worker applies besides (host-tier transfers, KV block copies, forks of n > 1 sequences,
    prompt-logprob positions)."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    new_requests: list[NewRequestData] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)  # left since the last step: the worker forgets
    trimmed_block_tables: dict[str, int] = field(default_factory=dict)  # request id -> table length it keeps
    preempted_request_ids: list[str] = field(default_factory=list)
    preemption_reasons: list[str] = field(default_factory=list)  # one per preempted request: why
    block_copies: list[tuple[int, int, int]] = field(default_factory=list)  # (src, dst, num_tokens) before the forward
    forks: list[ForkedRequest] = field(default_factory=list)
    prompt_logprob_positions: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (first, end)
    kv_transfers: KVTransfers | None = None  # host-tier copies, applied first (offloads, then loads)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        """Nothing for the worker: no chunk and no tier transfer."""
        return not self.chunks and not self.kv_transfers

    @property
    def sampling_request_ids(self) -> list[str]:
        """The requests that receive tokens this step, in the order of `ModelRunnerOutput`: the sampling chunks,
        then the forked children."""
        return [chunk.request_id for chunk in self.chunks if chunk.samples] + [fork.child_id for fork in self.forks]

    @property
    def pooling_request_ids(self) -> list[str]:
        """The pooling requests whose prompt this step completes: each gets its vector, then finishes."""
        return [chunk.request_id for chunk in self.chunks if chunk.pools]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position of the raw model distribution: the chosen token's logprob and rank (1 = most likely), and the
    top alternatives, most likely first."""

    token_id: int
    logprob: float
    rank: int
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True, slots=True)
class RequestError:
    """An exception that belongs to one request, as data (it crosses process boundaries and is never re-raised):
    where it happened, its type's name and its message."""

    phase: str
    error_type: str
    message: str

    @classmethod
    def of(cls, phase: str, error: BaseException) -> RequestError:
        return cls(phase, type(error).__name__, str(error))

    def __str__(self) -> str:
        return f"{self.phase} failed: {self.error_type}: {self.message}"


@dataclass
class ModelRunnerOutput:
    """What one step produced. Per request of `SchedulerOutput.sampling_request_ids` (same order): its new tokens
    (one, or the accepted drafts and one more) and their logprobs (None unless asked); the prompt logprobs of the
    positions asked for; the vector of each request of `SchedulerOutput.pooling_request_ids` (its pooled final
    hidden states, L2-normalized, as plain floats so that it pickles small and framework-free); and the exception
    of each request whose own work failed (sampling, prompt logprobs, pooling): that request fails alone, its
    tokens are not used (the worker logged its traceback)."""

    request_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[TokenLogprobs] | None] = field(default_factory=list)
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    embeddings: dict[str, list[float]] = field(default_factory=dict)  # request id -> its vector
    errors: dict[str, RequestError] = field(default_factory=dict)
    kv_transfer_seconds: float = 0.0  # the step's tier copies (`SchedulerOutput.kv_transfers`)
    kv_failed_keys: list[bytes] = field(default_factory=list)  # block files it could not write or read (or bad)

    def tokens_by_request(self) -> dict[str, list[int]]:
        return {rid: tokens for rid, tokens in zip(self.request_ids, self.sampled_token_ids, strict=True)
                if rid not in self.errors}


@dataclass(frozen=True, slots=True)
class RequestUpdate:
    """What changed for one sequence in the core, for the output processor: the tokens it kept (after token stops
    and its grammar's end) with their logprobs, prompt logprobs of the positions computed (None where the prefix
    cache supplied them), an embedding's vector, and how it ended, if it did (`error`: why it failed)."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    embedding: list[float] | None = None
    status: RequestStatus | None = None  # a finished status once it ended, else None
    stop_reason: int | str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TextStop:
    """A stop string the output processor found: the sequence keeps `num_output_tokens` tokens, then finishes."""

    request_id: str
    num_output_tokens: int
    stop_string: str
