"""The output side of a user's request: `ParentRequest` (the user's request, its n sequences and the outputs built
from them) and `RequestState` (the output side of one sequence: text, logprobs, how it finished).

Vocabulary (vLLM V1's): the engine core schedules `Request`s (`radixlm/request.py`), each one generated sequence.
A user's request with n (or best_of) sequences is a `ParentRequest` with n child requests: child 0 carries the
user's request id and computes the prompt; children 1.. (ids `id#1`, ...) are forked from it when it samples its
first token, sharing its prompt blocks. Each child has its own random stream: `seed + index` (for an unseeded
request, a seed mixed from the engine seed and the arrival number).
With best_of > n nothing is streamed: the finished output holds the n sequences of highest cumulative logprob.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixlm.core.step import TokenLogprobs
from radixlm.engine.text_stream import TextStream
from radixlm.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput
from radixlm.request import Request
from radixlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixlm.engine.logprob_formatter import LogprobFormatter


@dataclass
class RequestState:
    """The output side of one child request (`request`): its text, logprobs and how it finished."""

    index: int
    request: Request
    text: TextStream
    logprobs: list[PositionLogprobs] | None  # None unless `logprobs` was asked
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_reported_tokens: int = 0
    num_reported_logprobs: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add_token(self, token_id: int, num_output_tokens: int, logprobs: TokenLogprobs | None,
                  formatter: LogprobFormatter, stopped_by_token: bool) -> str | None:
        """Logprobs and text of output token number `num_output_tokens` (1-based); returns the stop string it
        completed, if any. `stopped_by_token`: the token finished the sequence (eos or a stop token id)."""
        if logprobs is not None:
            self.cumulative_logprob += logprobs.logprob
            if self.logprobs is not None:
                self.logprobs.append(formatter.position(logprobs))
        if stopped_by_token and not self.request.sampling_params.include_stop_str_in_output:
            return None  # the stopping token's text is not shown
        return self.text.add_token(token_id, num_output_tokens)

    def completion(self, index: int, finished_text: bool) -> CompletionOutput:
        """The cumulative state, with the part not reported before as `delta_*`."""
        token_ids = self.request.output_token_ids
        delta_logprobs = None
        if self.logprobs is not None:
            delta_logprobs = self.logprobs[self.num_reported_logprobs:]
            self.num_reported_logprobs = len(self.logprobs)
        delta_token_ids = token_ids[self.num_reported_tokens:]
        self.num_reported_tokens = len(token_ids)
        # First: finishing may add held-back bytes to the text. A failed sequence's text may be what failed.
        delta_text = "" if self.finish_reason == "error" else self.text.take_delta(finished_text)
        return CompletionOutput(
            index=index, text=self.text.text, token_ids=token_ids, finish_reason=self.finish_reason,
            stop_reason=self.stop_reason, delta_text=delta_text, delta_token_ids=delta_token_ids,
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=list(self.logprobs) if self.logprobs is not None else None, delta_logprobs=delta_logprobs)


@dataclass
class ParentRequest:
    """A user's request: its prompt and parameters, its child requests' states, what was reported so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    children: list[RequestState]
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # grows as prompt positions are computed
    changed: set[int] = field(default_factory=set)  # indices of sequences with news since the last output
    error: str | None = None  # why the request failed (its sequences finished with "error")
    metadata: dict[str, Any] | None = None  # the caller's, returned on every output
    on_finish: Callable[[RequestOutput], object] | None = None  # run once with the final output
    embedding: list[float] | None = None  # an embedding request's vector, once its prompt is computed

    @property
    def first(self) -> RequestState:
        return self.children[0]

    @property
    def finished(self) -> bool:
        return all(state.finished for state in self.children)

    @property
    def ranks_sequences(self) -> bool:
        return len(self.children) > self.params.n

    @property
    def prompt_logprobs_done(self) -> bool:
        return self.prompt_logprobs is None or len(self.prompt_logprobs) == len(self.prompt_token_ids)

    def make_output(self) -> RequestOutput | None:
        """The output of this step: the sequences that changed; None if nothing is to be reported now."""
        finished = self.finished
        if self.ranks_sequences:
            if not finished:
                return None
            best = sorted(self.children, key=lambda s: (-s.cumulative_logprob, s.index))[:self.params.n]
            completions = [state.completion(rank, True) for rank, state in enumerate(best)]
        else:
            completions = [self.children[i].completion(i, self.children[i].finished) for i in sorted(self.changed)]
        self.changed.clear()
        first = self.first.request
        times = first.times
        e2e = None
        if finished:
            e2e = max(s.request.times.finished or times.arrival for s in self.children) - times.arrival
        metrics = RequestMetrics(arrival_time=times.arrival, queue_time=times.queue_time, ttft=times.ttft, e2e=e2e,
                                 num_preemptions=sum(s.request.num_preemptions for s in self.children))
        return RequestOutput(request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
                             outputs=completions, finished=finished, metrics=metrics,
                             num_cached_tokens=first.num_cached_tokens, error=self.error, metadata=self.metadata,
                             embedding=self.embedding,
                             prompt_logprobs=list(self.prompt_logprobs) if self.prompt_logprobs_done and
                             self.prompt_logprobs is not None else None)
