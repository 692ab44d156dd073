"""PromptResult: what the server has received for one prompt so far, and the usage and timings it adds up to."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput
from radixlm.server.response_bodies import Usage
from radixlm.server.timings import Timings, merged, timings_of


@dataclass
class PromptResult:
    """Everything received so far for one prompt: its tokens, and the latest state of each sequence (or its
    vector, for an embedding request)."""

    prompt_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    sequences: dict[int, CompletionOutput] = field(default_factory=dict)
    embedding: list[float] | None = None
    metrics: RequestMetrics | None = None

    def update(self, output: RequestOutput) -> None:
        self.prompt_token_ids = output.prompt_token_ids
        self.num_cached_tokens = output.num_cached_tokens
        self.metrics = output.metrics
        self.embedding = output.embedding if output.embedding is not None else self.embedding
        if self.prompt_logprobs is None:
            self.prompt_logprobs = output.prompt_logprobs
        for sequence in output.outputs:
            self.sequences[sequence.index] = sequence


def usage_of(results: list[PromptResult]) -> Usage:
    return Usage.of(prompt_tokens=sum(len(r.prompt_token_ids) for r in results),
                    completion_tokens=sum(len(s.token_ids) for r in results for s in r.sequences.values()),
                    cached_tokens=sum(r.num_cached_tokens for r in results))


def timings_of_results(results: list[PromptResult]) -> Timings:
    """llama.cpp's timings of a request so far (`timings.merged` over several prompts)."""
    return merged([timings_of(r.metrics, len(r.prompt_token_ids), r.num_cached_tokens,
                              sum(len(s.token_ids) for s in r.sequences.values())) for r in results])
