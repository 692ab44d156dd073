"""What the engine hands back per request and step: vLLM-shaped RequestOutput / CompletionOutput."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    """One generated sequence: cumulative `text`/`token_ids`, plus what this step added (`delta_*`)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)

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
