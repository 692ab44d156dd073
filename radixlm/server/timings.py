"""Per-request timings in llama.cpp's `timings` shape, for clients that ask with `timings_per_token: true` (as
llama-server's do): how long the prompt and the generation took, and their speeds."""

from __future__ import annotations

import time

from pydantic import BaseModel

from radixlm.outputs import RequestMetrics


class Timings(BaseModel):
    """llama.cpp's fields (milliseconds, tokens), plus `queue_ms`: the wait before the request was first scheduled.
    `prompt_n` counts the prompt tokens computed (not those the prefix cache held: `cache_n`); `predicted_ms` runs
    from the first token to the last (or to now, while the request runs)."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    queue_ms: float

    @classmethod
    def of(cls, cache_n: int, prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float,
           queue_ms: float) -> Timings:
        prompt_per_token, prompt_per_second = _rates(prompt_n, prompt_ms)
        predicted_per_token, predicted_per_second = _rates(predicted_n, predicted_ms)
        return cls(cache_n=cache_n, prompt_n=prompt_n, prompt_ms=prompt_ms, prompt_per_token_ms=prompt_per_token,
                   prompt_per_second=prompt_per_second, predicted_n=predicted_n, predicted_ms=predicted_ms,
                   predicted_per_token_ms=predicted_per_token, predicted_per_second=predicted_per_second,
                   queue_ms=queue_ms)


def merged(each: list[Timings]) -> Timings:
    """Several prompts' timings (each its own engine request) as one: the counts add up, the times are the slowest
    prompt's."""
    if len(each) == 1:
        return each[0]
    return Timings.of(cache_n=sum(t.cache_n for t in each), prompt_n=sum(t.prompt_n for t in each),
                      prompt_ms=max(t.prompt_ms for t in each), predicted_n=sum(t.predicted_n for t in each),
                      predicted_ms=max(t.predicted_ms for t in each), queue_ms=max(t.queue_ms for t in each))


def _rates(num_tokens: int, ms: float) -> tuple[float, float]:
    """(ms per token, tokens per second); 0 where a count or a time is 0, never a division by zero."""
    per_token = ms / num_tokens if num_tokens > 0 else 0.0
    per_second = num_tokens * 1000.0 / ms if ms > 0 else 0.0
    return per_token, per_second


def timings_of(metrics: RequestMetrics | None, num_prompt_tokens: int, num_cached_tokens: int,
               num_generated_tokens: int) -> Timings:
    """The timings of a request so far (`metrics` as its latest RequestOutput carries them)."""
    queue = prompt = predicted = 0.0
    if metrics is not None:
        elapsed = metrics.e2e if metrics.e2e is not None else time.monotonic() - metrics.arrival_time
        queue = metrics.queue_time if metrics.queue_time is not None else elapsed
        first_token = metrics.ttft if metrics.ttft is not None else elapsed
        prompt = max(first_token - queue, 0.0)
        predicted = max(elapsed - first_token, 0.0)
    return Timings.of(cache_n=num_cached_tokens, prompt_n=max(num_prompt_tokens - num_cached_tokens, 0),
                      prompt_ms=prompt * 1000.0, predicted_n=num_generated_tokens, predicted_ms=predicted * 1000.0,
                      queue_ms=queue * 1000.0)
