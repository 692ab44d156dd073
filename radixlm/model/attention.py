"""Paged attention, plugged into transformers through its attention interface.

transformers calls `paged_attention(module, query, key, value, ...)` in every attention layer with RoPE (and q/k
norms) already applied. We write the new K/V at their slots, then attend. With the C++ kernel (`decode.tables`) every
row of every chunk attends as a decode, one call per layer, reading K/V blocks in place. The torch path (the
reference) makes one SDPA call per request (decodes fold their query heads per KV head; prefill chunks are causal),
reading a context that is one run of blocks as a slice of the cache and gathering the others. Per-step metadata
arrives as the `radix_attn` keyword argument of `model(...)`; nothing is global.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from radixlm.model.decode_kernel import (
    NewRows,
    decode_layer,
    kernel_takes_rows,
    paged_decode_attention,
    write_kv,
)
from radixlm.model.input_batch import AttentionMetadata, DecodeGroup, PrefillSegment

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
    """query `[1, Hq, T, D]`, key/value `[1, Hkv, T, D]` -> output `[1, T, Hq, D]`."""
    if radix_attn is None:
        raise RuntimeError("paged attention needs the radix_attn metadata argument")
    layer = module.layer_idx
    key_cache = radix_attn.kv_cache.key_caches[layer]
    value_cache = radix_attn.kv_cache.value_caches[layer]
    decode = radix_attn.decode
    # Every row decodes (the usual step): the kernel writes the new K/V itself, and its output is the whole output.
    every_row_decodes = (decode is not None and decode.tables is not None and not radix_attn.prefills
                         and decode.rows_are_prefix and len(decode.context_lens) == query.shape[2])
    if every_row_decodes:
        assert decode is not None and decode.tables is not None
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = decode_layer(query, key, value, key_cache, value_cache, decode.tables, radix_attn.slot_mapping, scale,
                           sliding_window, softcap)
        if out is not None:
            return out, None
    new_keys, new_values = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, Hkv, D]
    queries = query[0]  # [Hq, T, D]
    if every_row_decodes and kernel_takes_rows(new_keys, new_values):
        out = _decode_kernel(queries.transpose(0, 1), key_cache, value_cache, decode, scaling, sliding_window,
                             softcap, (radix_attn.slot_mapping, new_keys, new_values))
        return out[None], None
    write_kv(key_cache, value_cache, radix_attn.slot_mapping, new_keys, new_values)
    output = query.new_empty(queries.shape[1], queries.shape[0], queries.shape[2])  # [T, Hq, D]
    if radix_attn.decode is not None and radix_attn.decode.tables is not None:
        _attend_decodes_kernel(queries, key_cache, value_cache, radix_attn.decode, output, scaling, sliding_window,
                               softcap)
    elif radix_attn.decode is not None:
        _attend_decodes(queries, key_cache, value_cache, radix_attn.decode, output, scaling, sliding_window,
                        softcap)
    for segment in radix_attn.prefills:
        _attend_prefill(queries, new_keys, new_values, key_cache, value_cache, segment, output, scaling,
                        sliding_window, softcap)
    return output[None], None


def _attend_decodes_kernel(queries: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           group: DecodeGroup, output: torch.Tensor, scaling: float | None,
                           sliding_window: int | None, softcap: float | None) -> None:
    """All decodes in one C++ call that reads their blocks in place."""
    batch = len(group.context_lens)
    rows = queries.transpose(0, 1)  # [T, Hq, D]
    q = rows[:batch] if group.rows_are_prefix else rows.index_select(0, group.query_rows)
    out = _decode_kernel(q, key_cache, value_cache, group, scaling, sliding_window, softcap)
    if group.rows_are_prefix:
        output[:batch] = out
    else:
        output[group.query_rows] = out


def _decode_kernel(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, group: DecodeGroup,
                   scaling: float | None, sliding_window: int | None, softcap: float | None,
                   new_rows: NewRows | None = None) -> torch.Tensor:
    """q `[B, Hq, D]` (any strides) -> `[B, Hq, D]` from the C++ kernel, which first writes `new_rows` if given."""
    assert group.tables is not None
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    return paged_decode_attention(q, key_cache, value_cache, group.tables, scale, sliding_window, softcap, new_rows)


def _attend_decodes(queries: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    group: DecodeGroup, output: torch.Tensor, scaling: float | None, sliding_window: int | None,
                    softcap: float | None) -> None:
    """One SDPA call per request over exactly its context: on CPU this beats one padded batched call, whose
    gathered padding costs more memory traffic than the per-call overhead."""
    num_heads, _, head_dim = queries.shape
    num_kv_heads = key_cache.shape[1]
    batch = len(group.context_lens)
    q = queries[:, :batch] if group.rows_are_prefix else queries.index_select(1, group.query_rows)
    # Fold the query heads that share a KV head into the "sequence" axis: [B, Hkv, rep, D].
    q = q.transpose(0, 1).reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    outs = []
    for index, where in enumerate(group.all_slots(sliding_window)):
        keys = _read(key_cache, where, q.dtype).transpose(0, 1)[None]  # [1, Hkv, L, D]
        values = _read(value_cache, where, q.dtype).transpose(0, 1)[None]
        outs.append(_attention(q[index:index + 1], keys, values, None, scaling, softcap, causal=False))
    out = torch.cat(outs).reshape(batch, num_heads, head_dim)
    if group.rows_are_prefix:
        output[:batch] = out
    else:
        output[group.query_rows] = out


def _attend_prefill(queries: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor, segment: PrefillSegment,
                    output: torch.Tensor, scaling: float | None, sliding_window: int | None,
                    softcap: float | None) -> None:
    rows = slice(segment.start, segment.start + segment.num_queries)
    if segment.context_slots is None:  # the chunk is the whole context: use the fresh K/V directly
        keys, values = new_keys[rows], new_values[rows]
    else:
        keys = _read(key_cache, segment.context_slots, queries.dtype)
        values = _read(value_cache, segment.context_slots, queries.dtype)
    q = queries[:, rows][None]  # [1, Hq, q, D]
    mask = segment.mask(sliding_window)
    out = _attention(q, keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask, scaling, softcap,
                     causal=mask is None)
    output[rows] = out[0].transpose(0, 1)


def _read(cache: torch.Tensor, where: torch.Tensor | slice, dtype: torch.dtype) -> torch.Tensor:
    """The cache rows of a context in `dtype`: a view for a contiguous run of slots of that dtype, else a copy."""
    rows = cache[where] if isinstance(where, slice) else cache.index_select(0, where)
    return rows.to(dtype)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               scaling: float | None, softcap: float | None, causal: bool) -> torch.Tensor:
    """SDPA over `[B, H, Q, D]` x `[B, Hkv, L, D]`, or the explicit path when logits are soft-capped."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scaling,
                                              enable_gqa=q.shape[1] != k.shape[1])
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    scores = torch.tanh((q @ k.transpose(-1, -2)) * scale / softcap) * softcap
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
