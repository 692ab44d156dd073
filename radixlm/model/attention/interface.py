"""The function registered with transformers' attention interface: every attention layer of our models calls it.

transformers calls `paged_attention(module, query, key, value, ...)` in every attention layer with RoPE (and q/k
norms) already applied, and passes the `radix_attn` keyword of `model(...)` through to it. That keyword is the
forward's `AttentionMetadata`, which carries the backend that built it; this function hands the layer to it. Over
an int8 cache it first rotates the query, key and value rows by the cache's Hadamard matrix and rotates the output
back (`radixlm.model.kv_int8`: the rows are stored rotated), so that every backend sees the same rotated rows.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from radixlm.model.attention.backend import AttentionMetadata

# Avoid "sdpa", "flash", "flex" and "paged|" in the name: transformers gives those names special treatment.
ATTENTION_NAME = "radixlm_paged"


def register_paged_attention() -> str:
    """Register the function with transformers (idempotent) and return the `attn_implementation` name."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    return ATTENTION_NAME


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    sliding_window: int | None = None, softcap: float | None = None,
                    radix_attn: AttentionMetadata | None = None, **kwargs: object) -> tuple[torch.Tensor, None]:
    """query `[1, Hq, T, D]`, key/value `[1, Hkv, T, D]` -> output `[1, T, Hq, D]` (see `AttentionBackend.forward`);
    transformers' own mask is ignored: the metadata says what each row attends."""
    if radix_attn is None:
        raise RuntimeError("paged attention needs the radix_attn metadata argument")
    rotation = radix_attn.kv_cache.rotation_for(query.dtype)
    if rotation is not None:
        query, key, value = query @ rotation, key @ rotation, value @ rotation
    output = radix_attn.backend.forward(module.layer_idx, query, key, value, radix_attn, scaling, sliding_window,
                                        softcap)
    return (output if rotation is None else output @ rotation), None
