"""Cache-aware scheduling helpers: longest-prefix-match ordering and in-batch prefix de-duplication."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.radix_node import common_prefix_len
from radixlm.request import Request

# A waiting request that would recompute at least this many tokens another chunk computes in the same step waits a
# step instead, and then finds them in the tree. Below it, waiting costs more than recomputing.
IN_BATCH_PREFIX_THRESHOLD = 32


@dataclass
class InFlightPrefill:
    """A chunk scheduled this step that computes positions `[start, end)` of `token_ids` (not yet in the tree),
    under LoRA adapter `lora_id` (0: the base model)."""

    token_ids: list[int]
    start: int
    end: int
    lora_id: int = 0


def reuses_prefix_cache(request: Request) -> bool:
    """May `request` start from its cached prefix? Cached positions have K/V but no logits and no hidden states,
    so a request that needs those of every prompt position computes its whole prompt: prompt logprobs until its
    first token (as vLLM does), and mean pooling."""
    if request.pooling_params is not None:
        return not request.pooling_params.needs_every_position
    return request.sampling_params.prompt_logprobs is None or request.num_output_tokens > 0


def order_by_cached_prefix(waiting: list[Request], kv_cache_manager: KVCacheManager) -> list[Request]:
    """Longest usable cached prefix first (SGLang's `lpm`), after the preempted requests, which keep their place
    at the front; ties keep their current (first come, first served) order."""
    return sorted(waiting, key=lambda request: (
        request.num_preemptions == 0,
        -kv_cache_manager.cached_prefix_length(request) if reuses_prefix_cache(request) else 0))


def duplicates_in_flight_prefill(request: Request, num_cached: int, in_flight: list[InFlightPrefill]) -> bool:
    """Would `request`, starting at `num_cached`, compute at least IN_BATCH_PREFIX_THRESHOLD tokens that a chunk
    already scheduled this step computes for another request?"""
    tokens = request.all_token_ids
    for prefill in in_flight:
        if prefill.lora_id != request.lora_id:  # another adapter's K/V: nothing to share
            continue
        common = common_prefix_len(prefill.token_ids[:prefill.end], tokens)
        if common - max(num_cached, prefill.start) >= IN_BATCH_PREFIX_THRESHOLD:
            return True
    return False
