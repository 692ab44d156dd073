"""The plain-data contract between the scheduler and the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ScheduledChunk:
    """The tokens of one request whose K/V this step computes.

    `token_ids` are positions `start_position .. start_position + len(token_ids) - 1` of the request; their K/V go
    to the slots given by `block_table`, and attention runs over positions `0 .. start_position + len - 1`.
    When `samples` is true the step reaches the end of the request's tokens, so the logits of its last position are
    sampled.
    """

    request_id: str
    token_ids: list[int]
    start_position: int
    block_table: list[int]
    samples: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_position + len(self.token_ids)


@dataclass
class SchedulerOutput:
    """One step's work: the chunks to run (decodes first) and what the scheduler did on the way."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    preemption_reasons: list[str] = field(default_factory=list)  # one per preempted request: why
    block_copies: list[tuple[int, int, int]] = field(default_factory=list)  # (src, dst, num_tokens) before the forward

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    @property
    def sampling_request_ids(self) -> list[str]:
        """Request ids in the order of the logits rows the runner returns."""
        return [chunk.request_id for chunk in self.chunks if chunk.samples]
