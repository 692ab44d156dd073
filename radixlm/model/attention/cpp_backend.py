"""The C++ attention backend (`--attention-backend cpp`, the default when radixlm._C is built): the op
`radixlm::paged_decode_attention` (csrc/attention/paged_attention.cpp).

Every row of every chunk attends as the decode of its position, one call per layer, reading K/V blocks in place
through a flat block table built once per step (`DecodeTables`). A token's numbers therefore never depend on how its
prompt was chunked, cached or batched, and the kernel reads a chunk's context once for all its rows. The op also
writes the step's new K/V itself (one call per layer instead of two). It is a registered custom op with a fake
kernel (`radixlm.model.ops`), so `torch.compile` treats it as opaque; eager float32 and bfloat16 layers take its
direct entry point instead (`decode_layer`), without the dispatcher, their queries and new K/V as they are.

Over bfloat16 or int8 caches the step splits (`PrefillSplit`): decode rows stay on the kernel, and each prefill
chunk attends in bfloat16, through our AVX-512 BF16 prefill kernel on CPUs that have it without AMX
(`prefill_kernel.py`; over a bfloat16 cache all of a step's chunks in one paged call), else through PyTorch's SDPA
(its CPU flash attention, AMX-BF16 tiles where the CPU has them) as the torch backend does it. Either is several
times faster per layer than the decode kernel on a long prompt (SDPA on a Xeon with AMX: 7.4 against 39.4 ms for
2,000 tokens, 9 query heads of 64). A float32 model's queries and new K/V are rounded to bfloat16 for it (the cache
holds K/V at bfloat16 or below already): int8-weight models run float32 activations, and their prefill attention
took half of a 2,000-token prefill on the decode kernel. There a prompt's numbers may depend on its chunking, as the
cache's rounding already makes them differ from float32's; float32 caches keep the decode kernel for every row
(exact).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.model.attention.backend import AttentionBackend, AttentionMetadata, ChunkRows
from radixlm.model.attention.kv_write import KERNEL_ROW_DTYPES, kernel_takes_rows, write_kv
from radixlm.model.attention.prefill_kernel import (
    PagedPrefill,
    attend_prefill_chunk,
    attend_prefill_paged,
    prefill_kernel_available,
)
from radixlm.model.attention.torch_backend import PrefillSegment, reads_cache
from radixlm.model.device import to_device
from radixlm.model.kv_cache import LayerCache, PagedKVCache
from radixlm.model.ops import direct_kernel, extension_error

# Caches whose forwards split the step (see `PrefillSplit`): float32 ones keep every row on the kernel.
_SPLIT_DTYPES = (torch.bfloat16, torch.int8)
# A step's new K/V: (slot_mapping `[T]` int64, keys `[T, Hkv, D]`, values `[T, Hkv, D]`), rows in query order.
NewRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class DecodeTables:
    """Per-step inputs of the kernel, built once per step: request b's blocks are
    `block_table[block_offsets[b]:]`, its context `context_lens[b]` positions (all int32)."""

    block_table: torch.Tensor
    block_offsets: torch.Tensor
    context_lens: torch.Tensor
    block_size: int

    @classmethod
    def build(cls, block_tables: list[list[int]], context_lens: list[int], block_size: int) -> DecodeTables:
        """`block_tables[b]` must hold at least the blocks of `context_lens[b]` positions. Consecutive rows given
        the same table object with non-decreasing lengths (a decode verifying drafts: a row per position) share
        one copy of it, and the kernel reads their context once for all of them."""
        flat: list[int] = []
        offsets: list[int] = []
        previous: list[int] | None = None
        previous_len = 0
        for table, length in zip(block_tables, context_lens, strict=True):
            if table is previous and length >= previous_len:
                offsets.append(offsets[-1])
                flat.extend(table[-(-previous_len // block_size):-(-length // block_size)])
            else:
                offsets.append(len(flat))
                flat.extend(table[:-(-length // block_size)])
            previous, previous_len = table, length
        return cls(torch.tensor(flat, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int32),
                   torch.tensor(context_lens, dtype=torch.int32), block_size)


@dataclass
class PrefillSplit:
    """A forward's two parts over a bfloat16 or int8 cache: the rows that attend as decodes (`decode_rows` of the
    packed batch, with their own tables; None when there are none) and the prefill chunks, which attend through
    the prefill kernel (in one paged call when `paged` is set) or SDPA."""

    decode_rows: torch.Tensor | None
    decode_tables: DecodeTables | None
    prefills: list[PrefillSegment]
    paged: PagedPrefill | None = None  # the prefills for the paged kernel (a bfloat16 cache on a CPU it runs on)


@dataclass
class CppAttentionMetadata(AttentionMetadata):
    """The C++ backend's view of a forward: the kernel's block tables, a row per query row (`tables`, built on
    first use: a forward with a split never reads them), and, with a bfloat16 or int8 cache and a prefill chunk in
    the step, the split the forward takes."""

    chunks: Sequence[ChunkRows] = ()
    split: PrefillSplit | None = None

    @functools.cached_property
    def tables(self) -> DecodeTables:
        lens: list[int] = []
        tables: list[list[int]] = []
        for chunk in self.chunks:
            lens.extend(range(chunk.start_position + 1, chunk.context_len + 1))
            tables.extend([chunk.block_table] * chunk.num_tokens)  # one object: the kernel shares it
        return DecodeTables.build(tables, lens, self.kv_cache.block_size)


class CppAttentionBackend(AttentionBackend[CppAttentionMetadata]):
    """Every row of the forward attends as a decode, in one C++ call per layer (CPU; float32, bfloat16 or int8
    caches)."""

    name = "cpp"
    runs_cpp_kernels = True

    def __init__(self) -> None:
        """Needs the extension (`radixlm.model.ops.extension_error`); its kernel is CPU code."""
        error = extension_error()
        if error is not None:
            raise RuntimeError(f"radixlm._C is not built: {error}")

    def build_metadata(self, chunks: Sequence[ChunkRows], kv_cache: PagedKVCache,
                       slot_mapping: torch.Tensor) -> CppAttentionMetadata:
        split = None
        if kv_cache.dtype in _SPLIT_DTYPES and any(c.num_tokens != c.num_sampled for c in chunks):
            split = _split(chunks, kv_cache)
        metadata = CppAttentionMetadata(self, kv_cache, slot_mapping, chunks, split)
        if split is None:
            _ = metadata.tables  # every layer reads them: built here, with the rest of the step's set-up
        return metadata

    def forward(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                metadata: CppAttentionMetadata, scaling: float | None, sliding_window: int | None,
                softcap: float | None) -> torch.Tensor:
        caches = metadata.kv_cache.layer(layer)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if metadata.split is not None:
            return _forward_split(query, key, value, caches, metadata, scale, sliding_window, softcap)
        out = decode_layer(query, key, value, caches, metadata.tables, metadata.slot_mapping, scale, sliding_window,
                           softcap)
        if out is not None:
            return out
        new_keys, new_values = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, Hkv, D]
        rows = query[0].transpose(0, 1)  # [T, Hq, D]
        new_rows: NewRows | None = (metadata.slot_mapping, new_keys, new_values)
        if not kernel_takes_rows(new_keys, new_values):
            write_kv(caches, metadata.slot_mapping, new_keys, new_values)
            new_rows = None
        return paged_decode_attention(rows, caches, metadata.tables, scale, sliding_window, softcap, new_rows)[None]


def _split(chunks: Sequence[ChunkRows], kv_cache: PagedKVCache) -> PrefillSplit:
    rows: list[int] = []
    lens: list[int] = []
    tables: list[list[int]] = []
    prefills: list[PrefillSegment] = []
    prefill_chunks: list[ChunkRows] = []
    for chunk in chunks:
        if chunk.num_tokens == chunk.num_sampled:  # a decode, or one verifying drafts: a row per position
            rows.extend(range(chunk.first_row, chunk.first_row + chunk.num_tokens))
            lens.extend(range(chunk.start_position + 1, chunk.context_len + 1))
            tables.extend([chunk.block_table] * chunk.num_tokens)
            continue
        prefill_chunks.append(chunk)
        context = chunk.context_slots
        context = context if isinstance(context, slice) else to_device(context, kv_cache.device)
        prefills.append(PrefillSegment(start=chunk.first_row, num_queries=chunk.num_tokens,
                                       context_slots=context if reads_cache(chunk, kv_cache) else None,
                                       context_len=chunk.context_len, device=kv_cache.device))
    paged = None
    if kv_cache.dtype == torch.bfloat16 and kv_cache.device.type == "cpu" and prefill_kernel_available():
        paged = PagedPrefill.build(prefill_chunks, kv_cache.block_size)
    if not rows:
        return PrefillSplit(None, None, prefills, paged)
    return PrefillSplit(torch.tensor(rows), DecodeTables.build(tables, lens, kv_cache.block_size), prefills, paged)


def _forward_split(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, caches: LayerCache,
                   metadata: CppAttentionMetadata, scale: float, sliding_window: int | None,
                   softcap: float | None) -> torch.Tensor:
    """A layer over a bfloat16 or int8 cache: every new K/V written, decode rows through the kernel, prefill chunks
    through SDPA in bfloat16 (the output in the query's dtype)."""
    split = metadata.split
    assert split is not None
    new_keys, new_values = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, Hkv, D]
    write_kv(caches, metadata.slot_mapping, new_keys, new_values)
    queries = query[0]  # [Hq, T, D]
    output = query.new_empty(queries.shape[1], queries.shape[0], queries.shape[2])  # [T, Hq, D]
    if split.decode_rows is not None and split.decode_tables is not None:
        rows = queries.transpose(0, 1).index_select(0, split.decode_rows)
        output[split.decode_rows] = paged_decode_attention(rows, caches, split.decode_tables, scale, sliding_window,
                                                           softcap)
    if split.paged is not None and attend_prefill_paged(queries, caches, split.paged, output, scale, sliding_window,
                                                        softcap):
        return output[None]  # the paged call reads the new K/V back from the cache, written above
    if split.prefills and queries.dtype != torch.bfloat16:
        queries, new_keys, new_values = (t.to(torch.bfloat16) for t in (queries, new_keys, new_values))
    for segment in split.prefills:
        attend_prefill_chunk(queries, new_keys, new_values, caches, segment, output, scale, sliding_window, softcap)
    return output[None]


def decode_layer(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, caches: LayerCache,
                 tables: DecodeTables, slot_mapping: torch.Tensor, scale: float, sliding_window: int | None,
                 softcap: float | None) -> torch.Tensor | None:
    """One attention layer in one C++ call from the tensors transformers passes: query `[1, Hq, T, D]` and the new
    key/value `[1, Hkv, T, D]` -> `[1, T, Hq, D]`, the new K/V written at `slot_mapping` first. It takes the direct
    entry point (`radixlm._C.decode_attention`: the op without the dispatcher, and the views taken in C++; about 7 us
    a layer less) for float32 or bfloat16 CPU tensors (query, key and value of one dtype) without autograd; None
    otherwise, and the caller goes the general way."""
    if (query.dtype != key.dtype or not kernel_takes_rows(key, value) or caches.keys.device.type != "cpu"
            or torch.is_grad_enabled()):
        return None
    return direct_kernel("decode_attention")(query, key, value, caches.keys, caches.values, tables.block_table,
                                             tables.block_offsets, tables.context_lens, slot_mapping,
                                             tables.block_size, scale, sliding_window or 0, softcap or 0.0,
                                             caches.key_scales, caches.value_scales)


def paged_decode_attention(query: torch.Tensor, caches: LayerCache, tables: DecodeTables, scale: float,
                           sliding_window: int | None, softcap: float | None,
                           new_rows: NewRows | None = None) -> torch.Tensor:
    """query `[B, Hq, D]` (any float dtype) over one layer's caches `[num_slots, Hkv, D]` (float32, bfloat16 or int8
    with its scales) -> `[B, Hq, D]` in the query's dtype. Request b attends its last `sliding_window` positions
    (all when None); logits are soft-capped as `tanh(x / softcap) * softcap` when softcap is set. Arithmetic is
    float32 (the kernel takes float32 and bfloat16 queries as they are), except for bfloat16 queries over a
    bfloat16 cache on a CPU with AVX-512 BF16: bfloat16 dot products summed in float32, the softmax weights rounded
    to bfloat16 (csrc/attention/attention_tiles_dot.h). With `new_rows` (one per query row, float32
    or bfloat16: `kernel_takes_rows`) the kernel first writes them into the caches, as `write_kv` would."""
    error = extension_error()  # cached: imports the extension on first use
    if error is not None:
        raise RuntimeError(f"radixlm._C is not built: {error}")
    slot_mapping, new_keys, new_values = new_rows if new_rows is not None else (None, None, None)
    out = torch.ops.radixlm.paged_decode_attention(
        query if query.dtype in KERNEL_ROW_DTYPES else query.float(), caches.keys, caches.values,
        tables.block_table, tables.block_offsets, tables.context_lens,
        tables.block_size, scale, sliding_window or 0, softcap or 0.0, slot_mapping, new_keys, new_values,
        caches.key_scales, caches.value_scales)
    return out.to(query.dtype)
