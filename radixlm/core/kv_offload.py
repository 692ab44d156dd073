"""KVOffload: the host tier (`radixlm.core.host_tier`) wired under the radix tree.

- Down: when the tree evicts a leaf, the full blocks on it are stored in the host tier under their content keys
  (`radixlm.core.block_keys`) and an offload (device block -> host block) joins the step's transfers; the worker
  applies it before anything reuses the block.
- Up: before a request looks up its prefix, `promote` extends the tree's match with the host's blocks that follow
  it: fresh device blocks are allocated, loads (host block -> device block) join the step's transfers, and the
  blocks go into the tree as a new node. The lookup then finds them like any cached prefix, and the worker copies
  them in before the forward that first reads them. A load is a memory copy (a few milliseconds for thousands of
  tokens) against the seconds of prefill it saves, so it runs on the step's own thread, first.

A device block a load of this step writes is not offloaded if the tree evicts it again before the step is handed
over (its content is not there yet; the host holds it anyway). Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from radixlm.core.block_keys import block_keys
from radixlm.core.block_pool import BlockPool
from radixlm.core.host_tier import HostTier, KVTransfers
from radixlm.core.radix_cache import RadixCache, RadixNode


@dataclass
class OffloadStats:
    """Cumulative: device blocks offloaded to the host, host blocks loaded back, prompt tokens the loads supplied."""

    num_offloaded_blocks: int = 0
    num_loaded_blocks: int = 0
    num_hit_tokens: int = 0


class KVOffload:
    """Moves blocks between the tree's device blocks and a host tier; `take_transfers` hands each step's copies
    over."""

    def __init__(self, radix_cache: RadixCache, block_pool: BlockPool, host: HostTier,
                 allocate: Callable[[int], list[int] | None]) -> None:
        """`allocate(n)`: n free device blocks (evicting tree leaves if needed), or None."""
        self.radix_cache = radix_cache
        self.block_pool = block_pool
        self.host = host
        self.block_size = radix_cache.block_size
        self.stats = OffloadStats()
        self._allocate = allocate
        self._transfers = KVTransfers()
        self._loading: set[int] = set()  # device blocks this step's loads write
        self.enabled = True  # off while the tree is reset on purpose: what it drops is not kept
        radix_cache.on_evict = self._offload

    def _offload(self, leaf: RadixNode) -> None:
        if not self.enabled:
            return
        namespace, token_ids = self.radix_cache.path_of(leaf)
        first, num_full = leaf.start // self.block_size, leaf.end // self.block_size
        if num_full <= first:
            return
        keys = block_keys(token_ids, self.block_size, namespace, num_blocks=num_full)
        for index in range(first, num_full):
            device_block = leaf.block_ids[index - first]
            if device_block in self._loading:
                continue
            host_block = self.host.store(keys[index], namespace)
            if host_block is not None:
                self._transfers.offloads.append((device_block, host_block))
                self.stats.num_offloaded_blocks += 1

    def promote(self, token_ids: list[int], namespace: int) -> int:
        """Put the host's blocks that continue the tree's match of `token_ids` (whole blocks, in order, as far as
        they go) back into the tree; returns the tokens that adds to the match (0 when the host has none, or no
        device block is free)."""
        if not len(self.host):
            return 0
        size = self.block_size
        matched = self.radix_cache.match_length(token_ids, namespace)
        first = matched // size
        keys = block_keys(token_ids, size, namespace)
        end = first
        while end < len(keys) and keys[end] in self.host:
            end += 1
        if end * size <= matched:
            return 0
        host_blocks = [self.host.pin(key) for key in keys[first:end]]  # before allocating: eviction stores others
        match = self.radix_cache.match_prefix(token_ids[:matched], namespace)
        self.radix_cache.lock(match.node)  # the matched path must survive the allocation's evictions
        try:
            fresh = self._allocate(end - first)
            if fresh is None:
                return 0
            for host_block, device_block in zip(host_blocks, fresh, strict=True):
                assert host_block is not None
                self._transfers.loads.append((host_block, device_block))
                self._loading.add(device_block)
            self.radix_cache.insert(token_ids[:end * size], [-1] * first + fresh, namespace)
            self.block_pool.free(fresh)  # the tree's reference keeps them
        finally:
            self.radix_cache.unlock(match.node)
        self.stats.num_loaded_blocks += end - first
        self.stats.num_hit_tokens += end * size - matched
        return end * size - matched

    def take_transfers(self) -> KVTransfers | None:
        """The copies the step being handed to the worker must apply first (None when there are none); after
        this, their blocks may be reused."""
        transfers, self._transfers = self._transfers, KVTransfers()
        self._loading.clear()
        self.host.step_handed_over()
        return transfers or None
