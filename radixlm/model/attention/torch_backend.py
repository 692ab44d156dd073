"""The pure-PyTorch attention backend (`--attention-backend torch`): the reference, and the fallback without
radixlm._C or off the CPU.

Decodes (a request's one new token, or a decode verifying drafts: a row per position) make one SDPA call per request
over exactly its context, with the query heads that share a KV head folded together. A prefill chunk makes one
causal (windowed, soft-capped where the model asks) SDPA call; a chunk that is its request's whole context uses the
fresh K/V directly. A context that is one run of blocks is read as a slice of the cache, others are gathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from radixlm.model.attention.backend import AttentionBackend, AttentionMetadata, ChunkRows
from radixlm.model.attention.kv_write import write_kv
from radixlm.model.device import to_device
from radixlm.model.kv_cache import LayerCache, PagedKVCache
from radixlm.model.kv_int8 import dequantize_rows

_HOST = torch.device("cpu")


@dataclass
class DecodeGroup:
    """Query rows that attend as decodes: one token of a request over its context (a request verifying drafts has
    one row per position, each over the context up to it)."""

    query_rows: torch.Tensor     # [B] rows of the packed batch
    context_lens: list[int]      # [B]
    contexts: list[slice | torch.Tensor]  # [B] slots of positions 0..L-1 (a slice when they are one run)
    rows_are_prefix: bool        # query_rows == arange(B): slice instead of gather
    _windowed: dict[int | None, list[slice | torch.Tensor]] = field(default_factory=dict)

    def slots(self, index: int, sliding_window: int | None) -> torch.Tensor | slice:
        """Slots request `index` attends to (its whole context, or the last `sliding_window` positions): a slice
        of the cache when they are contiguous, else a tensor of slot indices to gather."""
        return self.all_slots(sliding_window)[index]

    def all_slots(self, sliding_window: int | None) -> list[slice | torch.Tensor]:
        """`slots(i, sliding_window)` for every request, computed once per step (every layer reads them)."""
        if sliding_window not in self._windowed:
            self._windowed[sliding_window] = [_window(context, length, sliding_window)
                                              for context, length in zip(self.contexts, self.context_lens, strict=True)]
        return self._windowed[sliding_window]


def _window(context: slice | torch.Tensor, length: int, sliding_window: int | None) -> slice | torch.Tensor:
    if sliding_window is None or sliding_window >= length:
        return context
    if isinstance(context, slice):
        return slice(context.stop - sliding_window, context.stop)
    return context[length - sliding_window:]


@dataclass
class PrefillSegment:
    """One request computing several tokens: query rows `start .. start + num_queries - 1`."""

    start: int
    num_queries: int
    context_slots: torch.Tensor | slice | None  # positions 0..L-1 (a slice when contiguous); None: the chunk is all
    context_len: int
    device: torch.device = _HOST  # where the masks go (the cache's device)
    _masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    @property
    def rows(self) -> slice:
        """The chunk's rows of the packed batch."""
        return slice(self.start, self.start + self.num_queries)

    def mask(self, sliding_window: int | None) -> torch.Tensor | None:
        """Boolean [num_queries, L] causal (and windowed) mask; None means plain causal with L == num_queries."""
        if sliding_window not in self._masks:
            if self.context_len == self.num_queries and (sliding_window is None or
                                                         sliding_window >= self.context_len):
                self._masks[sliding_window] = None
            else:
                query_pos = torch.arange(self.context_len - self.num_queries, self.context_len)[:, None]
                key_pos = torch.arange(self.context_len)[None, :]
                allowed = key_pos <= query_pos
                if sliding_window is not None:
                    allowed &= key_pos > query_pos - sliding_window
                self._masks[sliding_window] = to_device(allowed, self.device)
        return self._masks[sliding_window]


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    """The torch backend's view of a forward: its decode rows and its prefill chunks."""

    decode: DecodeGroup | None  # the rows of every chunk whose rows are all sampled
    prefills: list[PrefillSegment]  # the other chunks


class TorchAttentionBackend(AttentionBackend[TorchAttentionMetadata]):
    """SDPA per request over the paged cache; runs on any device and without radixlm._C."""

    name = "torch"
    runs_cpp_kernels = False

    def build_metadata(self, chunks: Sequence[ChunkRows], kv_cache: PagedKVCache,
                       slot_mapping: torch.Tensor) -> TorchAttentionMetadata:
        """Decodes and verifications join one `DecodeGroup` (each row attends like the decode of its position
        would, so drafted tokens get exactly the numbers plain decoding gives them); other chunks are prefill
        segments."""
        device = kv_cache.device
        rows: list[int] = []
        lens: list[int] = []
        contexts: list[slice | torch.Tensor] = []
        prefills: list[PrefillSegment] = []
        for chunk in chunks:
            start, context_len = chunk.start_position, chunk.context_len
            context = chunk.context_slots
            context = context if isinstance(context, slice) else to_device(context, device)
            if chunk.num_tokens == chunk.num_sampled:
                rows.extend(range(chunk.first_row, chunk.first_row + chunk.num_tokens))
                lens.extend(range(start + 1, context_len + 1))
                contexts.extend(_prefix(context, length) for length in range(start + 1, context_len))
                contexts.append(context)
            else:
                prefills.append(PrefillSegment(start=chunk.first_row, num_queries=chunk.num_tokens,
                                               context_slots=context if reads_cache(chunk, kv_cache) else None,
                                               context_len=context_len, device=device))
        decode = DecodeGroup(query_rows=to_device(torch.tensor(rows), device), context_lens=lens, contexts=contexts,
                             rows_are_prefix=rows == list(range(len(rows)))) if rows else None
        return TorchAttentionMetadata(self, kv_cache, slot_mapping, decode, prefills)

    def forward(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                metadata: TorchAttentionMetadata, scaling: float | None, sliding_window: int | None,
                softcap: float | None) -> torch.Tensor:
        caches = metadata.kv_cache.layer(layer)
        new_keys, new_values = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, Hkv, D]
        queries = query[0]  # [Hq, T, D]
        write_kv(caches, metadata.slot_mapping, new_keys, new_values)
        output = query.new_empty(queries.shape[1], queries.shape[0], queries.shape[2])  # [T, Hq, D]
        if metadata.decode is not None:
            _attend_decodes(queries, caches, metadata.decode, output, scaling, sliding_window, softcap)
        for segment in metadata.prefills:
            attend_prefill(queries, new_keys, new_values, caches, segment, output, scaling, sliding_window, softcap)
        return output[None]


def reads_cache(chunk: ChunkRows, kv_cache: PagedKVCache) -> bool:
    """Whether a prefill chunk attends K/V read back from the cache rather than its fresh ones: when it continues a
    context, and always over an int8 cache, so that a token's numbers do not depend on whether its prompt was one
    chunk (every later chunk and decode reads the quantized K/V)."""
    return chunk.start_position > 0 or kv_cache.dtype == torch.int8


def _prefix(context: slice | torch.Tensor, length: int) -> slice | torch.Tensor:
    """The slots of the first `length` positions of a context."""
    return slice(context.start, context.start + length) if isinstance(context, slice) else context[:length]


def _attend_decodes(queries: torch.Tensor, caches: LayerCache, group: DecodeGroup, output: torch.Tensor,
                    scaling: float | None, sliding_window: int | None, softcap: float | None) -> None:
    """One SDPA call per request over exactly its context: on CPU this beats one padded batched call, whose
    gathered padding costs more memory traffic than the per-call overhead."""
    num_heads, _, head_dim = queries.shape
    num_kv_heads = caches.keys.shape[1]
    batch = len(group.context_lens)
    q = queries[:, :batch] if group.rows_are_prefix else queries.index_select(1, group.query_rows)
    # Fold the query heads that share a KV head into the "sequence" axis: [B, Hkv, rep, D].
    q = q.transpose(0, 1).reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    outs = []
    for index, where in enumerate(group.all_slots(sliding_window)):
        keys = _read(caches.keys, caches.key_scales, where, q.dtype).transpose(0, 1)[None]  # [1, Hkv, L, D]
        values = _read(caches.values, caches.value_scales, where, q.dtype).transpose(0, 1)[None]
        outs.append(_attention(q[index:index + 1], keys, values, None, scaling, softcap, causal=False))
    out = torch.cat(outs).reshape(batch, num_heads, head_dim)
    if group.rows_are_prefix:
        output[:batch] = out
    else:
        output[group.query_rows] = out


def attend_prefill(queries: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor, caches: LayerCache,
                   segment: PrefillSegment, output: torch.Tensor, scaling: float | None, sliding_window: int | None,
                   softcap: float | None) -> None:
    """One prefill chunk's rows of `output` (`[T, Hq, D]`) through SDPA over its context: the chunk's fresh K/V
    when it is the whole context (`segment.context_slots` None), else the cache (its new K/V already written)."""
    rows = segment.rows
    keys, values = prefill_context(new_keys, new_values, caches, segment, queries.dtype)
    q = queries[:, rows][None]  # [1, Hq, q, D]
    mask = segment.mask(sliding_window)
    out = _attention(q, keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask, scaling, softcap,
                     causal=mask is None)
    output[rows] = out[0].transpose(0, 1)


def prefill_context(new_keys: torch.Tensor, new_values: torch.Tensor, caches: LayerCache, segment: PrefillSegment,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values `[L, Hkv, D]` (in `dtype`) a prefill chunk attends: its fresh K/V (`[T, Hkv, D]`, rows
    in query order) when it is its whole context, else its context's, read from the cache."""
    if segment.context_slots is None:
        return new_keys[segment.rows], new_values[segment.rows]
    return (_read(caches.keys, caches.key_scales, segment.context_slots, dtype),
            _read(caches.values, caches.value_scales, segment.context_slots, dtype))


def _read(cache: torch.Tensor, scales: torch.Tensor | None, where: torch.Tensor | slice,
          dtype: torch.dtype) -> torch.Tensor:
    """The cache rows of a context in `dtype` (int8 ones dequantized with their `scales`): a view for a contiguous
    run of slots of that dtype, else a copy."""
    rows = cache[where] if isinstance(where, slice) else cache.index_select(0, where)
    if scales is None:
        return rows.to(dtype)
    return dequantize_rows(rows, scales[where] if isinstance(where, slice) else scales.index_select(0, where), dtype)


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
