"""BlockPool: fixed-size KV blocks with reference counts and an O(1) free list. Pure Python, no torch."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class BlockPool:
    """Hands out block ids 0..num_blocks-1.

    A block is either free (ref count 0, on the free list exactly once) or held (ref count = number of holders:
    requests plus the radix tree). `allocate` returns blocks with ref count 1; `incref` adds a holder to blocks
    that are already held (sharing); `free` drops one holder per block and returns blocks that reach 0.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._free_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by someone."""
        return self.num_used_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free_ids)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free blocks (ref count 1 each); raises MemoryError if too few are free."""
        if num_blocks > len(self._free_ids):
            raise MemoryError(f"asked for {num_blocks} KV blocks, {len(self._free_ids)} free")
        block_ids = [self._free_ids.popleft() for _ in range(num_blocks)]
        for block_id in block_ids:
            self._ref_counts[block_id] = 1
        return block_ids

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add a holder to blocks that are already held."""
        for block_id in block_ids:
            if self._ref_counts[block_id] <= 0:
                raise ValueError(f"incref of free block {block_id}")
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one holder from each block; blocks left with no holder go back to the free list."""
        for block_id in block_ids:
            count = self._ref_counts[block_id]
            if count <= 0:
                raise ValueError(f"double free of block {block_id}")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free_ids.append(block_id)

    def check_invariants(self) -> None:
        """Every block is free (ref 0, listed once) or held (ref > 0, not listed)."""
        free_set = set(self._free_ids)
        assert len(free_set) == len(self._free_ids), "a block is on the free list twice"
        for block_id, count in enumerate(self._ref_counts):
            assert count >= 0, f"block {block_id} has negative ref count {count}"
            assert (count == 0) == (block_id in free_set), (
                f"block {block_id}: ref count {count} but {'on' if block_id in free_set else 'off'} the free list")
