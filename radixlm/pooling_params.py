"""PoolingParams: the parameters of an embedding request: pool the prompt's final hidden states, sample nothing.

An engine request carries either SamplingParams (generate) or PoolingParams (embed), as in vLLM. A pooling request
is scheduled like any prefill (token budget, chunked prefill, priorities, preemption, abort) and finishes in the
step that computes its last prompt token, with one vector and no token.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.config import POOLING_TYPES
from radixlm.errors import ParamError
from radixlm.sampling_params import SamplingParams


@dataclass(frozen=True)
class PoolingParams:
    """How the vector of an embedding request is made from the model's final hidden states (after the final norm,
    HF's `last_hidden_state`): `pooling_type` "last" takes the last prompt token's state, "mean" the mean over
    every prompt token's; None means the engine's `--pooling`. The result is always L2-normalized (a zero vector
    stays zero). An invalid value raises ValueError naming the field."""

    pooling_type: str | None = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ParamError("pooling_type", f"must be one of {POOLING_TYPES} or None (the engine's --pooling), "
                             f"got {self.pooling_type!r}")

    @property
    def needs_every_position(self) -> bool:
        """Mean pooling reads the hidden state of every prompt position; positions taken from the prefix cache
        have none (their K/V are reused, their hidden states were never kept), so such a request computes its
        whole prompt. "last" always computes its last position (a cache hit leaves at least one to compute)."""
        return self.pooling_type == "mean"

    def resolved(self, default_pooling_type: str) -> PoolingParams:
        """These parameters with the engine's pooling type filled in where none was given."""
        return self if self.pooling_type is not None else PoolingParams(default_pooling_type)


# What a pooling request carries where the scheduler and the worker read sampling parameters: no text to
# detokenize, and one token's worth of reserved KV growth at most (it never generates).
POOLING_SAMPLING_PARAMS = SamplingParams(max_tokens=1, detokenize=False)
