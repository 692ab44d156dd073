"""SequenceGroup: a user's request as the core sees it, the sequences it generates and what they share.

A request with n (or best_of) > 1 sequences is one group: its first sequence (the user's request id) computes the
prompt; the others are forked from it in the step where it samples its first token (sharing its prompt's KV
blocks), so until then they are `unforked`, known but not scheduled. A group whose grammar is still compiling is
`held`: known, counted against the queue limit, not queued yet. A failure or an abort ends a group whole.

The group also keeps the progress of its prompt logprobs (only the first sequence computes the prompt): the
position whose logits give the next prompt token's logprob, and how many positions the prefix cache supplied since
the worker last reported (those have no logits: their logprobs are None).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from radixlm.core.step import ScheduledChunk, TokenLogprobs
from radixlm.request import Request

logger = logging.getLogger(__name__)


@dataclass
class SequenceGroup:
    request_id: str
    sequences: list[Request]  # the first computes the prompt
    unforked: list[Request] = field(default_factory=list)
    held: bool = False
    next_prompt_logprob: int | None = None  # a position; None when prompt logprobs are not asked for
    num_skipped_prompt_logprobs: int = 0

    @classmethod
    def of(cls, sequences: list[Request], held: bool) -> SequenceGroup:
        first = sequences[0]
        asks = first.pooling_params is None and first.sampling_params.prompt_logprobs is not None
        return cls(first.request_id, sequences, list(sequences[1:]), held, 0 if asks else None)

    @property
    def first(self) -> Request:
        return self.sequences[0]

    @property
    def finished(self) -> bool:
        return all(sequence.is_finished for sequence in self.sequences)

    def prompt_logprob_positions(self, chunk: ScheduledChunk) -> tuple[int, int] | None:
        """The positions `(first, end)` of `chunk` whose logits give prompt logprobs not computed yet (prompt token
        j comes from position j - 1), if any. A recomputed (preempted) prompt skips the positions already done, so
        none is reported twice; positions the prefix cache supplied are skipped and reported as None."""
        cursor = self.next_prompt_logprob
        last = self.first.num_prompt_tokens - 1
        if cursor is None or chunk.request_id != self.request_id or cursor >= last:
            return None
        if chunk.start_position > cursor:  # positions reused from the prefix cache have no logits
            logger.warning("request %s: prompt positions %d..%d came from the prefix cache; their prompt "
                           "logprobs are None", self.request_id, cursor, chunk.start_position - 1)
            self.num_skipped_prompt_logprobs += chunk.start_position - cursor
            cursor = self.next_prompt_logprob = chunk.start_position
        end = min(chunk.context_len, last)
        return (cursor, end) if cursor < end else None

    def take_prompt_logprobs(self, entries: list[TokenLogprobs]) -> list[TokenLogprobs | None]:
        """The logprobs of the prompt tokens that follow those reported before: Nones for the skipped positions,
        then the worker's `entries` (one per position it computed)."""
        assert self.next_prompt_logprob is not None
        news: list[TokenLogprobs | None] = [None] * self.num_skipped_prompt_logprobs
        news += entries
        self.num_skipped_prompt_logprobs = 0
        self.next_prompt_logprob += len(entries)
        return news
