"""Prefill chunks' attention on our bfloat16 kernel (`torch.ops.radixlm.prefill_attention`,
csrc/attention/prefill_attention.cpp) on CPUs with AVX-512 BF16, where it beats PyTorch's CPU flash SDPA, the
reference (`torch_backend.attend_prefill`). Its two products run on AMX-BF16 tiles where the CPU has them (head sizes
that are multiples of 32; SDPA, on the same tiles, takes the others), else on AVX-512's bfloat16 dot product. One
layer of a 2,000-token prefill, the default model's 9 query heads of 64: 41.6 ms through SDPA against 14.7-14.9 on the
dot product on a Zen 4; 9.2-10.3 ms through SDPA against 7.1-7.3 on the tiles on a Xeon with AMX (`benchmarks/
prefill_attention.py`).

Over a bfloat16 cache every prefill chunk of a step attends in one call (`PagedPrefill`,
`torch.ops.radixlm.prefill_attention_paged`), reading its context through its block table: one call per layer
instead of a gather, a repack and a call per chunk, the threads balanced over all the chunks' rows, and a cached
prefix that several chunks share packed once. Sixteen 32-token questions on one 1,000-token prefix (the
shared-prefix workload's) spent 155-162 ms of the default model's step in attention this way, 210-215 ms one chunk
at a time (a Zen 4, the two trees alternated).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.model.attention.backend import ChunkRows
from radixlm.model.attention.torch_backend import PrefillSegment, attend_prefill, prefill_context
from radixlm.model.kv_cache import LayerCache
from radixlm.model.ops import direct_kernel, extension_error

_MAX_HEAD_DIM = 512


@functools.cache
def prefill_kernel_available() -> bool:
    """Whether prefill chunks take the kernel on this CPU: the extension is built and the CPU has AVX-512 BF16."""
    if extension_error() is not None:
        return False
    return bool(direct_kernel("avx512_bf16_available")())


@functools.cache
def prefill_tiles_available() -> bool:
    """Whether the kernel's products run on AMX-BF16 tiles here (the CPU has them and the OS allows them)."""
    return extension_error() is None and bool(direct_kernel("amx_bf16_available")())


def kernel_takes(head_dim: int) -> bool:
    """Whether the kernel takes this head size on this CPU: a multiple of 16 up to 512, and of 32 where the tiles
    run (there SDPA, on the same tiles, serves the others)."""
    if head_dim % 16 or head_dim > _MAX_HEAD_DIM:
        return False
    return not prefill_tiles_available() or head_dim % 32 == 0


def attend_prefill_chunk(queries: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor,
                         caches: LayerCache, segment: PrefillSegment, output: torch.Tensor, scale: float,
                         sliding_window: int | None, softcap: float | None, use_kernel: bool | None = None) -> None:
    """`attend_prefill`'s contract (queries `[Hq, T, D]` bfloat16, the chunk's rows of `output` `[T, Hq, D]`
    written) through the kernel when `use_kernel` (None: `prefill_kernel_available()`) and the shapes allow it
    (bfloat16, `kernel_takes` the head size), else through SDPA."""
    if use_kernel is None:
        use_kernel = prefill_kernel_available()
    if not use_kernel or queries.dtype != torch.bfloat16 or not kernel_takes(queries.shape[-1]):
        attend_prefill(queries, new_keys, new_values, caches, segment, output, scale, sliding_window, softcap)
        return
    rows = segment.rows
    keys, values = prefill_context(new_keys, new_values, caches, segment, torch.bfloat16)
    target = output[rows] if output.dtype == torch.bfloat16 else torch.empty_like(output[rows], dtype=torch.bfloat16)
    torch.ops.radixlm.prefill_attention(queries[:, rows].transpose(0, 1), keys, values, target, scale,
                                        sliding_window or 0, softcap or 0.0, prefill_tiles_available())
    if target.dtype != output.dtype:
        output[rows] = target


@dataclass(frozen=True)
class PagedPrefill:
    """A step's prefill chunks for the paged kernel: chunk i's query rows, context length and blocks
    (`segments[i]` = first row, rows, context length, offset of its blocks in `block_table`)."""

    block_table: torch.Tensor  # int32, the chunks' tables one after another
    segments: torch.Tensor  # int64 [n, 4]
    block_size: int
    rows: torch.Tensor  # int64: every chunk's rows of the step (a float32 model's output takes them back)

    @classmethod
    def build(cls, chunks: Sequence[ChunkRows], block_size: int) -> PagedPrefill:
        """The prefill chunks' tables, each cut to the blocks of its context."""
        flat: list[int] = []
        segments: list[list[int]] = []
        rows: list[int] = []
        for chunk in chunks:
            segments.append([chunk.first_row, chunk.num_tokens, chunk.context_len, len(flat)])
            flat.extend(chunk.block_table[:-(-chunk.context_len // block_size)])
            rows.extend(range(chunk.first_row, chunk.first_row + chunk.num_tokens))
        return cls(torch.tensor(flat, dtype=torch.int32), torch.tensor(segments, dtype=torch.int64), block_size,
                   torch.tensor(rows, dtype=torch.int64))


def attend_prefill_paged(queries: torch.Tensor, caches: LayerCache, paged: PagedPrefill, output: torch.Tensor,
                         scale: float, sliding_window: int | None, softcap: float | None) -> bool:
    """Every prefill chunk in one kernel call over a bfloat16 cache that already holds the step's K/V: queries
    `[Hq, T, D]` (rounded to bfloat16 here), the chunks' rows of `output` `[T, Hq, D]` written. False, doing
    nothing, when the kernel does not take these shapes (the caller goes chunk by chunk)."""
    if caches.keys.dtype != torch.bfloat16 or not kernel_takes(queries.shape[-1]):
        return False
    queries = queries.to(torch.bfloat16)
    target = output if output.dtype == torch.bfloat16 else torch.empty_like(output, dtype=torch.bfloat16)
    torch.ops.radixlm.prefill_attention_paged(queries.transpose(0, 1), caches.keys, caches.values, target,
                                              paged.block_table, paged.segments, paged.block_size, scale,
                                              sliding_window or 0, softcap or 0.0, prefill_tiles_available())
    if target is not output:
        output.index_copy_(0, paged.rows, target.index_select(0, paged.rows).to(output.dtype))
    return True
