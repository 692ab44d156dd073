"""KVCacheManager: gives requests the KV blocks their token progress needs, and takes them back."""

from __future__ import annotations

from collections.abc import Iterable

from radixlm.core.block_pool import BlockPool
from radixlm.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Owns the block pool; each request's block table lives on the request (`request.block_table`).

    A request computing `num_new_tokens` more tokens needs blocks for positions `0 .. num_computed + num_new - 1`.
    `can_allocate` / `allocate_slots` check and extend its table; `free` drops all of its blocks.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    @property
    def capacity_tokens(self) -> int:
        return self.block_pool.num_blocks * self.block_size

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Blocks to add to `request.block_table` so that `num_new_tokens` more tokens have slots."""
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, total - len(request.block_table))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.block_pool.can_allocate(self.num_blocks_needed(request, num_new_tokens))

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Extend the request's block table for `num_new_tokens` more tokens; False (and no change) if short."""
        needed = self.num_blocks_needed(request, num_new_tokens)
        if not self.block_pool.can_allocate(needed):
            return False
        request.block_table.extend(self.block_pool.allocate(needed))
        return True

    def free(self, request: Request) -> None:
        """Drop the request's hold on all its blocks (shared blocks stay with their other holders)."""
        self.block_pool.free(reversed(request.block_table))  # tail first: those blocks are the least reusable
        request.block_table = []

    def check_invariants(self, live_requests: Iterable[Request]) -> None:
        """Pool consistency, and every block's ref count equals the number of live requests holding it."""
        self.block_pool.check_invariants()
        holders = [0] * self.block_pool.num_blocks
        for request in live_requests:
            assert len(request.block_table) * self.block_size >= request.num_computed_tokens, (
                f"{request}: block table too short for its computed tokens")
            for block_id in request.block_table:
                holders[block_id] += 1
        for block_id, count in enumerate(holders):
            assert self.block_pool.ref_count(block_id) == count, (
                f"block {block_id}: ref count {self.block_pool.ref_count(block_id)}, holders {count}")
