"""Admission: a user request checked against the engine's limits and built into its ParentRequest.

Every check that depends only on the request and the engine's configuration runs here, before anything is built
for the request (a request asking for 10^9 sequences is refused without building one).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence as Seq

from transformers import PreTrainedTokenizerBase

from radixlm.config import EngineConfig
from radixlm.engine.parent_request import ParentRequest, RequestState
from radixlm.engine.text_stream import TextStream
from radixlm.errors import ParamError
from radixlm.lora_request import LoRARequest
from radixlm.pooling_params import POOLING_SAMPLING_PARAMS, PoolingParams
from radixlm.request import Request, child_request_id
from radixlm.sample.rng import mix_seed
from radixlm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def max_model_len(configured: int | None, num_kv_slots: int, max_position_embeddings: int | None) -> int:
    """The longest prompt + output admitted: the configured value, capped by the KV cache capacity (so a lone
    request always fits) and the model's positions."""
    limits = [num_kv_slots, *([max_position_embeddings] if max_position_embeddings else [])]
    if configured is not None:
        limits.append(configured)
    length = min(limits)
    if configured and length < configured:
        logger.warning("max_model_len capped at %d tokens (KV cache capacity or model limit)", length)
    return length


def eos_token_ids(model_eos_token_ids: frozenset[int], tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every end-of-sequence id the model (its generation config and config) or the tokenizer names."""
    value = getattr(tokenizer, "eos_token_id", None)
    return model_eos_token_ids | frozenset([value] if isinstance(value, int) else value or [])


def check_vocabulary(params: SamplingParams, vocab_size: int) -> None:
    """ParamError naming `logit_bias` or `stop_token_ids` when one holds a token id outside the vocabulary (the
    server checks it before it tokenizes or compiles anything; the engine again, for offline callers)."""
    for name, token_ids in (("logit_bias", [t for t, _ in params.logit_bias or ()]),
                            ("stop_token_ids", params.stop_token_ids)):
        outside = [t for t in token_ids or () if t >= vocab_size]  # type: ignore[union-attr]
        if outside:
            raise ParamError(name, f"holds token id {outside[0]}, outside the vocabulary [0, {vocab_size})")


class Admission:
    """Builds the ParentRequest of each new request; numbers arrivals (their order and unseeded random streams)."""

    def __init__(self, config: EngineConfig, tokenizer: PreTrainedTokenizerBase, vocab_size: int,
                 eos_token_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.engine_seed = config.model.seed
        self.pooling_type = config.model.pooling  # what a PoolingParams without a pooling type gets
        self.max_sequences_per_request = min(config.scheduler.max_sequences_per_request,
                                             config.scheduler.max_num_seqs)
        self._arrival_counter = itertools.count()

    def check_params(self, params: SamplingParams) -> None:
        """Raise ValueError (naming the field) for parameters this engine cannot serve."""
        limit = self.max_sequences_per_request
        if params.num_sequences > limit:
            name = "n" if params.best_of is None or params.best_of == params.n else "best_of"
            raise ParamError(name, f"must be <= {limit} (--max-sequences-per-request, --max-num-seqs), got "
                             f"{params.num_sequences}")
        check_vocabulary(params, self.vocab_size)

    def tokenize(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)):  # not bytes, a dict or None: those iterate into something else
            raise ParamError("prompt", f"must be a string or a list of token ids, got {type(prompt).__name__}")
        token_ids = list(prompt)
        bad = [t for t in token_ids
               if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
        if bad:
            raise ParamError("prompt", f"token ids must be integers in [0, {self.vocab_size}), got {bad[0]!r}")
        return token_ids

    def build_parent(self, request_id: str, prompt: str | Seq[int], params: SamplingParams | PoolingParams,
                     priority: int, arrival_time: float | None, lora_request: LoRARequest | None = None,
                     ) -> ParentRequest:
        """The parent of a checked request: one core Request per sequence (its child requests), each with its own
        random stream (`seed + index`; an unseeded request's seed is mixed from the engine seed and its arrival
        number), all running LoRA adapter `lora_request` (None: the base model). PoolingParams: one request that
        pools its prompt (the engine's pooling type unless given)."""
        if isinstance(params, PoolingParams):
            return self._pooling_parent(request_id, prompt, params.resolved(self.pooling_type), priority,
                                        arrival_time, lora_request)
        prompt_token_ids = self.tokenize(prompt)
        arrival_order = next(self._arrival_counter)
        seed = params.seed if params.seed is not None else mix_seed(self.engine_seed, arrival_order)
        children = []
        for index in range(params.num_sequences):
            request = Request(child_request_id(request_id, index), prompt_token_ids, params,
                              eos_token_ids=self.eos_token_ids, arrival_order=arrival_order, priority=priority,
                              arrival_time=arrival_time, sampling_seed=seed + index, lora_request=lora_request)
            children.append(RequestState(index, request, TextStream(self.tokenizer, prompt_token_ids, params),
                                      [] if params.logprobs is not None else None))
        return ParentRequest(request_id, prompt if isinstance(prompt, str) else None, prompt_token_ids, params,
                             children, prompt_logprobs=[None] if params.prompt_logprobs is not None else None)

    def _pooling_parent(self, request_id: str, prompt: str | Seq[int], params: PoolingParams, priority: int,
                        arrival_time: float | None, lora_request: LoRARequest | None) -> ParentRequest:
        """An embedding request: one core Request that pools its prompt; no text, no random stream."""
        prompt_token_ids = self.tokenize(prompt)
        request = Request(request_id, prompt_token_ids, POOLING_SAMPLING_PARAMS, eos_token_ids=self.eos_token_ids,
                          arrival_order=next(self._arrival_counter), priority=priority, arrival_time=arrival_time,
                          pooling_params=params, lora_request=lora_request)
        state = RequestState(0, request, TextStream(self.tokenizer, prompt_token_ids, POOLING_SAMPLING_PARAMS), None)
        return ParentRequest(request_id, prompt if isinstance(prompt, str) else None, prompt_token_ids,
                             POOLING_SAMPLING_PARAMS, [state])
