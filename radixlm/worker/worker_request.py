"""WorkerRequest: the worker's own state of one request, built from `NewRequestData` and kept up to date by the
step deltas and by the tokens it samples itself."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from radixlm.core.step import ForkedRequest, NewRequestData
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams


@dataclass
class WorkerRequest:
    """Token ids (prompt, then the tokens sampled so far), sampling parameters, random stream and block table.
    Reads like the engine's `Request` where the sampler looks (`radixlm.sample.batch.SamplingRow`).
    A pooling request keeps its pooled state across its prompt's chunks (`pooled`, over `num_pooled_positions`):
    dropped with the request when it finishes or is preempted, so a resumed one pools from scratch."""

    request_id: str
    all_token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    sampling_seed: int
    eos_token_ids: frozenset[int]
    block_table: list[int] = field(default_factory=list)
    num_drafts_before: int = 0  # 0, or j for the view `draft_row` makes for sampling row j of a verification
    pooling_params: PoolingParams | None = None
    pooled: Any = None  # a [hidden] float32 tensor: the running sum of the final hidden states ("mean"), or the last
    num_pooled_positions: int = 0
    lora_id: int = 0  # the LoRA adapter it runs with (0: the base model)

    @classmethod
    def from_new(cls, data: NewRequestData) -> WorkerRequest:
        return cls(data.request_id, list(data.token_ids), data.num_prompt_tokens,
                   SamplingParams.from_dict(data.sampling_params), data.sampling_seed, frozenset(data.eos_token_ids),
                   pooling_params=data.pooling_params, lora_id=data.lora_id)

    def add_pooled(self, reduced: Any, num_positions: int) -> None:
        """Fold one chunk's reduced hidden states (`radixlm.model.pooling.reduce_chunk`) into `pooled`."""
        assert self.pooling_params is not None
        mean = self.pooling_params.pooling_type == "mean"
        self.pooled = reduced if self.pooled is None or not mean else self.pooled + reduced
        self.num_pooled_positions += num_positions

    def fork(self, fork: ForkedRequest) -> WorkerRequest:
        """Sequence `fork.child_id`: this request's prompt and parameters, its own seed and blocks."""
        assert self.num_tokens == self.num_prompt_tokens, "a sequence forks before its first token"
        return WorkerRequest(fork.child_id, list(self.all_token_ids), self.num_prompt_tokens, self.sampling_params,
                             fork.sampling_seed, self.eos_token_ids, list(fork.block_ids), lora_id=self.lora_id)

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
