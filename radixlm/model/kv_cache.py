"""PagedKVCache: per-layer K/V tensors addressed by slot (block_id * block_size + offset), sized from a budget."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

import psutil
import torch

from radixlm.config_values import parse_memory
from radixlm.model.huge_pages import HugePageArena
from radixlm.model.kv_int8 import SCALE_DTYPE, rotation

logger = logging.getLogger(__name__)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x kv_heads x (head_dim x bytes per element, plus an int8 cache's float16 scale)."""
    scale_bytes = SCALE_DTYPE.itemsize if dtype == torch.int8 else 0
    return 2 * num_layers * num_kv_heads * (head_dim * dtype.itemsize + scale_bytes)


class LayerCache(NamedTuple):
    """One layer's K/V caches `[num_slots, Hkv, D]` and, for int8 caches, their scales `[num_slots, Hkv]` (float16,
    see `radixlm.model.kv_int8`; None otherwise)."""

    keys: torch.Tensor
    values: torch.Tensor
    key_scales: torch.Tensor | None
    value_scales: torch.Tensor | None


def num_blocks_for_budget(kv_cache_memory: float | str, bytes_per_block: int,
                          device: torch.device | str = "cpu") -> int:
    """Blocks that fit a budget given as bytes, or as a fraction (<= 1) of the device's memory free right now
    (host RAM for cpu, the GPU's for cuda, after the weights are loaded)."""
    budget = parse_memory(kv_cache_memory)
    if budget <= 1.0:
        free = (torch.cuda.mem_get_info(device)[0] if torch.device(device).type == "cuda"
                else psutil.virtual_memory().available)
        budget *= free
    num_blocks = int(budget // bytes_per_block)
    if num_blocks < 1:
        raise ValueError(f"kv_cache_memory {kv_cache_memory!r} holds no block of {bytes_per_block} bytes")
    return num_blocks


class PagedKVCache:
    """K and V for every layer as `[num_blocks * block_size, num_kv_heads, head_dim]` tensors.

    Token position `p` of a request lives at slot `block_table[p // block_size] * block_size + p % block_size`.
    An int8 cache (`dtype` torch.int8) also holds `key_scales` / `value_scales`, `[num_slots, num_kv_heads]` float16
    per layer (empty lists for the other dtypes).
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        num_slots = num_blocks * block_size
        shape = (num_slots, num_kv_heads, head_dim)
        # Zeroed, so the whole budget is committed now: the server's memory is what the log says from the start
        # (torch.empty would commit pages as blocks are first written, so RSS would creep up for hours and look
        # like a leak), and no page fault lands on a serving step. On the CPU on huge pages (a block's K/V spans a
        # few 4 KiB pages, and a request's blocks lie anywhere): decode attention 1.04-1.07x faster
        # (`benchmarks/huge_pages.py`, caches cold, the two placements alternated; Zen 4, 2026-12-05).
        arena = HugePageArena() if self.device.type == "cpu" else None

        def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            if arena is None:
                return torch.zeros(shape, dtype=dtype, device=device)
            return arena.empty(shape, dtype).zero_()

        self.key_caches = [zeros(shape, dtype) for _ in range(num_layers)]
        self.value_caches = [zeros(shape, dtype) for _ in range(num_layers)]
        num_scaled = num_layers if dtype == torch.int8 else 0
        # An int8 cache holds its rows rotated (see radixlm.model.kv_int8); the attention layers rotate around it.
        rotated = rotation(head_dim) if dtype == torch.int8 else None
        self.rotation = rotated.to(self.device) if rotated is not None else None
        self._rotations: dict[torch.dtype, torch.Tensor] = {}
        self.key_scales = [zeros(shape[:2], SCALE_DTYPE) for _ in range(num_scaled)]
        self.value_scales = [zeros(shape[:2], SCALE_DTYPE) for _ in range(num_scaled)]
        bytes_total = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype) * num_slots
        logger.info("KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB (%d bytes per token)",
                    num_blocks, block_size, num_slots, bytes_total / 2**20, bytes_total // num_slots)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def dtype(self) -> torch.dtype:
        """The caches' storage dtype."""
        return self.key_caches[0].dtype

    def rotation_for(self, dtype: torch.dtype) -> torch.Tensor | None:
        """`rotation` in `dtype` (converted once), or None when the rows are stored as they are."""
        if self.rotation is None:
            return None
        if dtype not in self._rotations:
            self._rotations[dtype] = self.rotation.to(dtype)
        return self._rotations[dtype]

    def layer(self, index: int) -> LayerCache:
        """Layer `index`'s caches (and scales)."""
        if self.key_scales:
            return LayerCache(self.key_caches[index], self.value_caches[index], self.key_scales[index],
                              self.value_scales[index])
        return LayerCache(self.key_caches[index], self.value_caches[index], None, None)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the cache, slots first: the keys and values of each layer, then any scales."""
        return [*self.key_caches, *self.value_caches, *self.key_scales, *self.value_scales]

    def copy_blocks(self, copies: Iterable[tuple[int, int, int]]) -> None:
        """Copy the first `num_tokens` slots of block `src` into block `dst`, in every layer (copy-on-write)."""
        for src, dst, num_tokens in copies:
            src_start, dst_start = src * self.block_size, dst * self.block_size
            for cache in self.tensors():
                cache[dst_start:dst_start + num_tokens] = cache[src_start:src_start + num_tokens]
