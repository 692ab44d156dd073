"""KVCacheManager: gives requests the KV blocks their token progress needs, reusing cached prefixes.

A request's block table lives on the request (`request.block_table`). With prefix caching on, a new request
starts from its longest cached prefix: full blocks are shared (ref counts), a match ending inside a block gets a
fresh block holding a copy of the matched part (copy-on-write, token-granular hits). Computed tokens go into the
radix tree after each prefill chunk and when the request ends (finished, aborted or preempted), so the next turn or
the resumed request hits. When the pool runs short, unlocked least-recently-used tree leaves are evicted before
the caller has to preempt anyone. With a host tier (`num_host_blocks`), what the tree evicts is offloaded to host
memory and prompts that reach it load it back (`radixlm.core.kv_offload`): `take_transfers` hands each step's copies
to the worker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from radixlm.core.block_pool import BlockPool, cdiv
from radixlm.core.disk_tier import DiskTier
from radixlm.core.host_tier import HostTier, KVTransfers
from radixlm.core.kv_offload import KVOffload
from radixlm.core.radix_cache import RadixCache
from radixlm.core.radix_node import PrefixMatch, RadixNode
from radixlm.request import Request

# Output tokens a new request's block reservation plans for at most (a preference only, see _reserve_growth).
_MAX_RESERVED_OUTPUT_TOKENS = 512


@dataclass
class PrefixCacheStats:
    """Prompt tokens looked up at first admission and how many of them were cached."""

    num_queried_tokens: int = 0
    num_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class KVCacheManager:
    """Owns the block pool and (optionally) the radix tree over it."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 num_host_blocks: int = 0, disk: DiskTier | None = None, salt: bytes = b"") -> None:
        """`num_host_blocks` > 0 (with prefix caching): a host tier of that many blocks under the tree, and `disk`
        under it; `salt` (the model's identity) starts every block key."""
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self.radix_cache = RadixCache(self.block_pool, block_size) if enable_prefix_caching else None
        self.offload = (KVOffload(self.radix_cache, self.block_pool, HostTier(num_host_blocks), self._allocate_blocks,
                                  disk, salt)
                        if num_host_blocks > 0 and self.radix_cache is not None else None)
        self.stats = PrefixCacheStats()
        self._locked_nodes: dict[str, RadixNode] = {}  # request id -> the tree node its blocks are locked under

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_evicted_blocks(self) -> int:
        return self.radix_cache.num_evicted_blocks if self.radix_cache else 0

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Blocks to add to `request.block_table` so that `num_new_tokens` more tokens have slots."""
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, total - len(request.block_table))

    def _allocate_blocks(self, num_blocks: int, after: int | None = None) -> list[int] | None:
        """Take free blocks (preferring the run after `after`), evicting unlocked tree leaves if needed; None
        (nothing taken) if still short."""
        missing = num_blocks - self.block_pool.num_free_blocks
        if missing > 0 and self.radix_cache is not None:
            self.radix_cache.evict(missing)
        if not self.block_pool.can_allocate(num_blocks):
            return None
        return self.block_pool.allocate(num_blocks, after=after)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Extend the request's block table for `num_new_tokens` more tokens; False (and no change) if short."""
        first_allocation = not request.block_table
        last = request.block_table[-1] if request.block_table else None
        block_ids = self._allocate_blocks(self.num_blocks_needed(request, num_new_tokens), after=last)
        if block_ids is None:
            return False
        request.block_table.extend(block_ids)
        if first_allocation and block_ids:
            self._reserve_growth(request)
        return True

    def _reserve_growth(self, request: Request) -> None:
        """Keep the blocks after a new request's table for the rest of its prompt and (some of) its output, while
        the pool has room, so that its K/V stay one contiguous run (see BlockPool.reserve_after)."""
        num_output_tokens = min(request.sampling_params.max_tokens or _MAX_RESERVED_OUTPUT_TOKENS,
                                _MAX_RESERVED_OUTPUT_TOKENS)
        num_blocks = cdiv(request.num_tokens + num_output_tokens, self.block_size) - len(request.block_table)
        if num_blocks > 0 and 2 * num_blocks <= self.block_pool.num_free_blocks:
            self.block_pool.reserve_after(request.block_table[-1], num_blocks)

    # -- prefix reuse ------------------------------------------------------------------------------------------
    def match_prefix(self, request: Request) -> PrefixMatch | None:
        """The cached prefix a request with nothing computed could start from (at least one token is left to
        compute, so the request still gets logits). None when caching is off."""
        if self.radix_cache is None:
            return None
        token_ids = request.all_token_ids[:request.num_tokens - 1]
        if self.offload is not None:
            self.offload.promote(token_ids, request.lora_id)
        return self.radix_cache.match_prefix(token_ids, request.lora_id)

    def prefetch(self, request: Request) -> bool:
        """Start reading the block files a waiting request's prompt reaches (disk tier); True while it must wait."""
        if self.offload is None:
            return False
        return self.offload.prefetch(request.all_token_ids[:request.num_tokens - 1], request.lora_id)

    def take_transfers(self) -> KVTransfers | None:
        """The tier copies the step being handed to the worker applies before its forward (None: none)."""
        return self.offload.take_transfers() if self.offload is not None else None

    def finish_transfers(self, transfers: KVTransfers | None, failed_keys: list[bytes]) -> None:
        """The worker applied a step's transfers; `failed_keys`: block files it could not write or read."""
        if self.offload is not None:
            self.offload.finish_transfers(transfers, failed_keys)

    def cancel_transfers(self) -> None:
        """The step whose transfers were handed over failed before its copies ran: the host blocks its disk reads
        were to fill are free again (the files stay on disk)."""
        if self.offload is not None:
            self.offload.host.finish_reads(failed=set(self.offload.host.reading_keys()))

    def persist_transfers(self) -> KVTransfers | None:
        """At a clean shutdown: the transfers that save the cached prefixes to disk (None without a disk tier)."""
        if self.offload is None or self.offload.disk is None:
            return None
        return self.offload.persist() or None

    def cached_prefix_length(self, request: Request) -> int:
        """Like `match_prefix(...).num_tokens`, without touching the tree (for ordering waiting requests)."""
        if self.radix_cache is None:
            return 0
        return self.radix_cache.match_length(request.all_token_ids[:request.num_tokens - 1], request.lora_id)

    def allocate_with_prefix(self, request: Request, match: PrefixMatch | None, num_new_tokens: int,
                             block_copies: list[tuple[int, int, int]]) -> bool:
        """Start a request with nothing computed: share `match`'s full blocks, copy its partial block, and add
        slots for `num_new_tokens` tokens after the match. Appends the copy to `block_copies`. False if short."""
        if match is None or match.num_tokens == 0:
            return self.allocate_slots(request, num_new_tokens)
        assert self.radix_cache is not None and request.num_computed_tokens == 0 and not request.block_table
        self.radix_cache.lock(match.node)  # before allocating: eviction must not take the matched path
        num_full = match.num_tokens // self.block_size
        num_fresh = cdiv(match.num_tokens + num_new_tokens, self.block_size) - num_full
        fresh = self._allocate_blocks(num_fresh)
        if fresh is None:
            self.radix_cache.unlock(match.node)
            return False
        shared = match.block_ids[:num_full]
        self.block_pool.incref(shared)
        partial = match.num_tokens % self.block_size
        if partial:
            block_copies.append((match.block_ids[num_full], fresh[0], partial))
        request.block_table = shared + fresh
        request.num_computed_tokens = match.num_tokens
        self._locked_nodes[request.request_id] = match.node
        if fresh:
            self._reserve_growth(request)
        return True

    def record_admission(self, request: Request) -> None:
        """Count a first admission in the hit-rate statistics and on the request."""
        request.num_cached_tokens = request.num_computed_tokens
        self.stats.num_queried_tokens += request.num_prompt_tokens
        self.stats.num_hit_tokens += request.num_computed_tokens

    def _insert_computed(self, request: Request) -> RadixNode | None:
        if self.radix_cache is None or request.num_computed_tokens == 0:
            return None
        return self.radix_cache.insert(request.all_token_ids[:request.num_computed_tokens], request.block_table,
                                       request.lora_id)

    def cache_computed(self, request: Request) -> None:
        """Insert the request's computed tokens into the tree and move its lock to the new node."""
        node = self._insert_computed(request)
        if node is None:
            return
        assert self.radix_cache is not None
        self.radix_cache.lock(node)
        old = self._locked_nodes.pop(request.request_id, None)
        if old is not None:
            self.radix_cache.unlock(old)
        self._locked_nodes[request.request_id] = node

    def free(self, request: Request) -> None:
        """Release the request's blocks; with caching on its computed tokens stay in the tree for others."""
        self._insert_computed(request)
        node = self._locked_nodes.pop(request.request_id, None)
        if node is not None:  # a split during the insert keeps the locked node object as the lower part
            self.radix_cache.unlock(node)  # type: ignore[union-attr]
        self.block_pool.free(reversed(request.block_table))  # tail first: those blocks are the least reusable
        request.block_table = []

    def trim(self, request: Request, num_tokens: int) -> int:
        """Free the blocks at the end of the request's table beyond those `num_tokens` tokens need (after rejected
        draft tokens); returns the table's new length. Its computed tokens must fit in what is kept."""
        num_kept = cdiv(num_tokens, self.block_size)
        assert request.num_computed_tokens <= num_kept * self.block_size, request
        if num_kept < len(request.block_table):
            self.block_pool.free(reversed(request.block_table[num_kept:]))
            del request.block_table[num_kept:]
        return len(request.block_table)

    def drop_namespace(self, lora_id: int) -> int:
        """Forget the cached prefixes of an unloaded LoRA adapter (no request of it may be running); returns the
        blocks freed."""
        if self.offload is not None:
            self.offload.host.drop_namespace(lora_id)
        return self.radix_cache.remove_namespace(lora_id) if self.radix_cache is not None else 0

    def reset_prefix_cache(self) -> None:
        """Evict every unlocked tree node (all of them when no request is live), and empty the host tier."""
        if self.radix_cache is None:
            return
        if self.offload is None:
            self.radix_cache.reset()
            return
        self.offload.enabled = False  # dropped, not offloaded
        try:
            self.radix_cache.reset()
        finally:
            self.offload.enabled = True
        self.offload.host.clear()

    def fork(self, parent: Request, child: Request, num_tokens: int) -> list[tuple[int, int, int]]:
        """Give `child` (holding no blocks) the K/V of `parent`'s first `num_tokens` positions (n > 1 sampling).

        Full blocks are shared (one more reference each). A partly filled last block would be written by both, so
        the child gets a fresh block and the returned `(src, dst, num_tokens)` copy must be applied before its next
        forward; with no block to spare the child keeps only the full blocks and recomputes the rest. Sets
        `child.num_computed_tokens` to what its blocks hold.
        """
        assert not child.block_table and len(parent.block_table) * self.block_size >= num_tokens
        num_full = num_tokens // self.block_size
        child.block_table = parent.block_table[:num_full]
        self.block_pool.incref(child.block_table)
        child.num_computed_tokens = num_full * self.block_size
        num_partial = num_tokens - child.num_computed_tokens
        fresh = self._allocate_blocks(1) if num_partial else None
        if fresh is None:
            return []
        child.block_table.append(fresh[0])
        child.num_computed_tokens = num_tokens
        return [(parent.block_table[num_full], fresh[0], num_partial)]

    def check_invariants(self, live_requests: Iterable[Request]) -> None:
        """Pool and tree consistency; every block's ref count equals its holders (live requests + tree nodes)."""
        self.block_pool.check_invariants()
        if self.offload is not None:
            self.offload.host.check_invariants()
        holders = [0] * self.block_pool.num_blocks
        if self.radix_cache is not None:
            self.radix_cache.check_invariants()
            for block_id, count in self.radix_cache.block_refs().items():
                holders[block_id] += count
        for request in live_requests:
            assert len(request.block_table) * self.block_size >= request.num_computed_tokens, (
                f"{request}: block table too short for its computed tokens")
            for block_id in request.block_table:
                holders[block_id] += 1
        for block_id, count in enumerate(holders):
            assert self.block_pool.ref_count(block_id) == count, (
                f"block {block_id}: ref count {self.block_pool.ref_count(block_id)}, holders {count}")
