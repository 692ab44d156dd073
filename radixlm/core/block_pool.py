"""BlockPool: fixed-size KV blocks with reference counts and an O(1) free list. Pure Python, no torch."""

from __future__ import annotations

from collections.abc import Iterable


class BlockPool:
    """Hands out block ids 0..num_blocks-1.

    A block is either free (ref count 0, on the free list exactly once) or held (ref count = number of holders:
    requests plus the radix tree). `allocate` returns blocks with ref count 1; `incref` adds a holder to blocks
    that are already held (sharing); `free` drops one holder per block and returns blocks that reach 0.

    The free list is a doubly linked list (first in, first out), so any free block can also be taken in O(1).
    That lets a growing request continue its own run of blocks (`allocate(..., after=last_block)`) and a new
    request keep the run after its prompt for its output (`reserve_after`): a request whose blocks are one run
    has its K/V in one contiguous slice, which attention reads without gathering.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        # Linked list over block ids with a sentinel at index num_blocks.
        self._sentinel = num_blocks
        self._next = list(range(1, num_blocks + 2))
        self._prev = list(range(-1, num_blocks))
        self._next[num_blocks] = 0
        self._prev[0] = num_blocks
        self._num_free = num_blocks

    # -- free list -------------------------------------------------------------------------------------------
    def _unlink(self, block_id: int) -> None:
        prev, nxt = self._prev[block_id], self._next[block_id]
        self._next[prev] = nxt
        self._prev[nxt] = prev
        self._num_free -= 1

    def _append(self, block_id: int) -> None:
        last = self._prev[self._sentinel]
        self._next[last] = block_id
        self._prev[block_id] = last
        self._next[block_id] = self._sentinel
        self._prev[self._sentinel] = block_id
        self._num_free += 1

    def _is_free(self, block_id: int) -> bool:
        return 0 <= block_id < self.num_blocks and self._ref_counts[block_id] == 0

    # -- public API ------------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks held by someone (the radix tree included)."""
        return self.num_used_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self._num_free

    def allocate(self, num_blocks: int, after: int | None = None) -> list[int]:
        """Take `num_blocks` free blocks (ref count 1 each): first the free blocks right after `after`, then the
        oldest free ones. Raises MemoryError if too few are free."""
        if num_blocks > self._num_free:
            raise MemoryError(f"asked for {num_blocks} KV blocks, {self._num_free} free")
        block_ids: list[int] = []
        candidate = -1 if after is None else after + 1
        while len(block_ids) < num_blocks and self._is_free(candidate):
            block_ids.append(candidate)
            self._unlink(candidate)
            self._ref_counts[candidate] = 1
            candidate += 1
        while len(block_ids) < num_blocks:
            block_id = self._next[self._sentinel]
            self._unlink(block_id)
            self._ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def reserve_after(self, block_id: int, num_blocks: int) -> None:
        """Move up to `num_blocks` free blocks that follow `block_id` to the back of the free list, so that others
        take them last. They stay free: this is a preference, never a hold."""
        for candidate in range(block_id + 1, block_id + 1 + num_blocks):
            if not self._is_free(candidate):
                return
            self._unlink(candidate)
            self._append(candidate)

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add a holder to blocks that are already held."""
        for block_id in block_ids:
            if self._ref_counts[block_id] <= 0:
                raise ValueError(f"incref of free block {block_id}")
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one holder from each block; blocks left with no holder go to the back of the free list."""
        for block_id in block_ids:
            count = self._ref_counts[block_id]
            if count <= 0:
                raise ValueError(f"double free of block {block_id}")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._append(block_id)

    def free_block_ids(self) -> list[int]:
        """The free list in allocation order (oldest first)."""
        block_ids = []
        block_id = self._next[self._sentinel]
        while block_id != self._sentinel:
            block_ids.append(block_id)
            block_id = self._next[block_id]
        return block_ids

    def check_invariants(self) -> None:
        """Every block is free (ref 0, listed once) or held (ref > 0, not listed); the list links both ways."""
        listed = self.free_block_ids()
        free_set = set(listed)
        assert len(free_set) == len(listed) == self._num_free, "free list corrupted"
        for block_id in listed:
            assert self._next[self._prev[block_id]] == block_id, f"block {block_id} badly linked"
        for block_id, count in enumerate(self._ref_counts):
            assert count >= 0, f"block {block_id} has negative ref count {count}"
            assert (count == 0) == (block_id in free_set), (
                f"block {block_id}: ref count {count} but {'on' if block_id in free_set else 'off'} the free list")


def cdiv(a: int, b: int) -> int:
    """Ceiling division: blocks of size `b` that `a` tokens need."""
    return -(-a // b)
