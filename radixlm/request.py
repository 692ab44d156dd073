"""Request: one sequence being generated, its status state machine, token progress and timestamps.

Token-progress model: `num_tokens` (prompt + generated) and `num_computed_tokens` (tokens whose K/V are in the
cache). The scheduler moves `num_computed_tokens` toward `num_tokens`; a request samples a token only in a step that
brings it to `num_tokens`. A fresh prompt, a prefill chunk, a prefix-cache hit, a resumed preempted request and a
decode step are all the same code path.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass

from radixlm.errors import ParamError
from radixlm.lora_request import LoRARequest, lora_id_of
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"  # an exception that belongs to this request ended it; the others go on

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        """The finish_reason of a finished status: "stop", "length", "abort" or "error" (not OpenAI's: the server
        answers a failed request with an error, never with this reason)."""
        return _FINISH_REASONS.get(self)


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                       RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR})
_FINISH_REASONS = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                   RequestStatus.FINISHED_ABORTED: "abort", RequestStatus.FINISHED_ERROR: "error"}
_ENDED_FROM_ANY_STATE = frozenset({RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR})
_ALLOWED_TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    RequestStatus.WAITING: frozenset({RequestStatus.RUNNING, *_ENDED_FROM_ANY_STATE}),
    RequestStatus.RUNNING: frozenset({RequestStatus.PREEMPTED, *_FINISHED}),
    RequestStatus.PREEMPTED: frozenset({RequestStatus.WAITING, *_ENDED_FROM_ANY_STATE}),
}


def child_request_id(request_id: str, index: int) -> str:
    """The scheduler's id of sequence `index` of a user request (n > 1): the user's id for the first, a suffixed
    one for the others."""
    return request_id if index == 0 else f"{request_id}#{index}"


class IllegalTransitionError(RuntimeError):
    """Raised when a request is moved between states the state machine does not connect."""


@dataclass
class RequestTimes:
    """Monotonic timestamps (seconds) of a request's life; None until the event happens."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


class Request:
    """One generated sequence, or one pooled prompt (`pooling_params` set: an embedding request, which computes
    its prompt and samples nothing). The scheduler and KV cache manager own its progress fields and block table."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_ids: frozenset[int] = frozenset(), arrival_order: int = 0, priority: int = 0,
                 arrival_time: float | None = None, sampling_seed: int = 0,
                 pooling_params: PoolingParams | None = None, lora_request: LoRARequest | None = None) -> None:
        if not prompt_token_ids:
            raise ParamError("prompt", "must contain at least one token")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.lora_request = lora_request  # the adapter it runs with (None: the base model)
        self.lora_id = lora_id_of(lora_request)  # what its K/V are cached under in the radix tree
        self.eos_token_ids = eos_token_ids
        self.arrival_order = arrival_order
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.num_prompt_tokens = len(prompt_token_ids)
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_tokens = self.num_prompt_tokens
        self.last_token_id = self.all_token_ids[-1]
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens whose K/V came from the prefix cache (first schedule)
        self.block_table: list[int] = []
        self.num_blocks_sent = 0  # how much of `block_table` the model worker has (see core/step.py)
        self.draft_token_ids: list[int] = []  # proposed next tokens, verified in the next step (speculation)
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None  # the stop token id or stop string that finished it
        # The key of this sequence's random stream: token t is drawn with uniform number t of the stream.
        self.sampling_seed = sampling_seed
        self.times = RequestTimes(arrival=time.monotonic() if arrival_time is None else arrival_time)

    # -- token views ---------------------------------------------------------------------------------------------
    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.num_tokens += 1
        self.last_token_id = token_id

    def truncate_output(self, num_output_tokens: int) -> None:
        """Keep only the first `num_output_tokens` output tokens (a stop string ended the sequence inside a step
        that gave it several)."""
        del self.all_token_ids[self.num_prompt_tokens + num_output_tokens:]
        self.num_tokens = len(self.all_token_ids)
        self.last_token_id = self.all_token_ids[-1]
        self.num_computed_tokens = min(self.num_computed_tokens, self.num_tokens)

    # -- state machine -------------------------------------------------------------------------------------------
    def transition(self, new_status: RequestStatus, now: float | None = None) -> None:
        """Move to `new_status`, or raise IllegalTransitionError; stamps first-scheduled and finished times."""
        if new_status not in _ALLOWED_TRANSITIONS.get(self.status, frozenset()):
            raise IllegalTransitionError(
                f"request {self.request_id}: illegal transition {self.status.name} -> {new_status.name}")
        logger.debug("request %s: %s -> %s (thread %s)", self.request_id, self.status.name, new_status.name,
                     threading.current_thread().name)
        self.status = new_status
        now = time.monotonic() if now is None else now
        if new_status is RequestStatus.RUNNING and self.times.first_scheduled is None:
            self.times.first_scheduled = now
        elif new_status is RequestStatus.PREEMPTED:
            self.num_preemptions += 1
        elif new_status.is_finished:
            self.times.finished = now

    def record_token_time(self, now: float) -> None:
        if self.times.first_token is None:
            self.times.first_token = now
        self.times.last_token = now

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})")
