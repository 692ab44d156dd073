"""NgramDrafter: proposes each decoding request's drafts before the step, learns from what was accepted after it.

How many tokens a request drafts adapts to it: it starts at `num_speculative_tokens`; a fully accepted draft lets
the next one double (up to the limit), a partly rejected one shrinks the next to what was accepted plus one;
a request that was offered drafts many times and never accepted one stops drafting (its text does not repeat).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from radixlm.config import SpeculativeConfig
from radixlm.core.step import SchedulerOutput
from radixlm.request import Request, RequestStatus
from radixlm.speculative.ngram import find_draft

# Drafts offered without a single accepted token before a request stops drafting.
_MAX_UNACCEPTED_DRAFTS = 8


@dataclass
class SpecDecodingStats:
    """Cumulative counts, as vLLM's spec-decode metrics name them."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass
class _RequestDrafts:
    num_tokens: int  # the next draft's length
    num_drafts: int = 0
    num_accepted_tokens: int = 0


class NgramDrafter:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.stats = SpecDecodingStats(num_accepted_tokens_per_pos=[0] * config.num_speculative_tokens)
        self._requests: dict[str, _RequestDrafts] = {}

    def propose(self, running: Iterable[Request]) -> dict[str, list[int]]:
        """Drafts for every running request at its last token (never for a pooling request), by request id: the
        scheduler verifies them in the next step where its budget allows."""
        live: dict[str, _RequestDrafts] = {}
        drafts: dict[str, list[int]] = {}
        for request in running:
            state = self._requests.get(request.request_id) or _RequestDrafts(self.config.num_speculative_tokens)
            live[request.request_id] = state
            if (request.status is not RequestStatus.RUNNING or request.num_uncomputed_tokens != 1
                    or request.num_output_tokens == 0 or state.num_tokens == 0
                    or request.pooling_params is not None):  # an embedding samples nothing to verify
                continue
            drafts[request.request_id] = find_draft(request.all_token_ids, state.num_tokens,
                                                    self.config.prompt_lookup_max, self.config.prompt_lookup_min)
        self._requests = live  # ended requests are forgotten
        return drafts

    def record(self, scheduler_output: SchedulerOutput, token_ids: dict[str, list[int]]) -> None:
        """Learn from the verified chunks: `token_ids[request_id]` are the tokens each request kept."""
        for chunk in scheduler_output.chunks:
            num_drafted = chunk.num_draft_tokens
            if not num_drafted or chunk.request_id not in token_ids:
                continue
            num_accepted = len(token_ids[chunk.request_id]) - 1
            stats = self.stats
            stats.num_drafts += 1
            stats.num_draft_tokens += num_drafted
            stats.num_accepted_tokens += num_accepted
            for position in range(num_accepted):
                stats.num_accepted_tokens_per_pos[position] += 1
            state = self._requests.get(chunk.request_id)
            if state is None:
                continue
            state.num_drafts += 1
            state.num_accepted_tokens += num_accepted
            limit = self.config.num_speculative_tokens
            state.num_tokens = min(limit, 2 * num_drafted) if num_accepted == num_drafted else num_accepted + 1
            if state.num_accepted_tokens == 0 and state.num_drafts >= _MAX_UNACCEPTED_DRAFTS:
                state.num_tokens = 0
