"""WorkerRequest: the worker's own state of one request, built from `NewRequestData` and kept up to date by the
step deltas and by the tokens it samples itself."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from radixlm.core.step import ForkedRequest, NewRequestData
from radixlm.sampling_params import SamplingParams


@dataclass
class WorkerRequest:
    """Token ids (prompt, then the tokens sampled so far), sampling parameters, random stream and block table.
    Reads like the engine's `Request` where the sampler looks (`radixlm.sample.batch.SamplingRequest`)."""

    request_id: str
    all_token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    sampling_seed: int
    eos_token_ids: frozenset[int]
    block_table: list[int] = field(default_factory=list)
    num_drafts_before: int = 0  # 0, or j for the view `draft_row` makes for sampling row j of a verification

    @classmethod
    def from_new(cls, data: NewRequestData) -> WorkerRequest:
        return cls(data.request_id, list(data.token_ids), data.num_prompt_tokens,
                   SamplingParams.from_dict(data.sampling_params), data.sampling_seed, frozenset(data.eos_token_ids))

    def fork(self, fork: ForkedRequest) -> WorkerRequest:
        """Sequence `fork.child_id`: this request's prompt and parameters, its own seed and blocks."""
        assert self.num_tokens == self.num_prompt_tokens, "a sequence forks before its first token"
        return WorkerRequest(fork.child_id, list(self.all_token_ids), self.num_prompt_tokens, self.sampling_params,
                             fork.sampling_seed, self.eos_token_ids, list(fork.block_ids))

    def draft_row(self, draft_token_ids: list[int]) -> WorkerRequest:
        """Sampling row j of this request verifying drafts: the request as it would be with its first j drafts
        kept, so the row draws uniform number `num_output_tokens` of the request's stream and counts the drafts
        before it for penalties and min_tokens, exactly as plain decoding would at that position."""
        return replace(self, all_token_ids=self.all_token_ids + draft_token_ids, num_drafts_before=len(draft_token_ids))

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens
