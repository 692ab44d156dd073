"""What the engine hands back per request and step: vLLM-shaped RequestOutput / CompletionOutput.

Contract (shared by the offline API and the server):
- `LLMEngine.step()` returns one RequestOutput per user request that changed in the step. Its `outputs` hold the
  CompletionOutputs (one per sequence index; n > 1 gives several) that changed in this step, each with its
  cumulative `text` / `token_ids` / `logprobs` and the `delta_*` part added by this step.
- `RequestOutput.finished` is true once every sequence of the request has finished; the offline API collects
  the final state of every index.
- An embedding request (`PoolingParams`) has one output, when its prompt is computed: finished, sequence 0 with no
  token and finish_reason "stop", and `RequestOutput.embedding` its L2-normalized vector.
- A request that failed (an exception that belongs to it: its sampling row, grammar, text, callback, or the forward
  of its batch) is finished with `finish_reason="error"` on its sequences and the message in `RequestOutput.error`;
  the server answers 500 (or an SSE error event, then `[DONE]`) with that message. Other requests go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Logprob:
    """The log-probability of one token at one position, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# For one position: token id -> Logprob, holding the chosen token plus the top alternatives asked for.
PositionLogprobs = dict[int, Logprob]


@dataclass
class RequestMetrics:
    """Seconds, measured with time.monotonic(); None until the event happens."""

    arrival_time: float
    queue_time: float | None = None
    ttft: float | None = None
    e2e: float | None = None
    num_preemptions: int = 0


@dataclass
class CompletionOutput:
    """One generated sequence: cumulative `text`/`token_ids`/`logprobs`, plus what this step added (`delta_*`)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort", "error" or None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None  # one entry per generated token, when asked
    delta_logprobs: list[PositionLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # first position None, as in vLLM
    error: str | None = None  # why the request failed (its sequences finish with "error"); None otherwise
    metadata: dict[str, Any] | None = None  # what the caller attached to the request (`add_request(metadata=...)`)
    embedding: list[float] | None = None  # an embedding request's vector (on its finished output); None otherwise
