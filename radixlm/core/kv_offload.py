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
over (its content is not there yet; the host holds it anyway).

With a disk tier (`radixlm.core.disk_tier`), blocks the host tier drops are written to files, and `prefetch` reads
the files a waiting prompt reaches into host blocks, one step ahead: the request waits for that step, whose worker
checks every file, and is admitted once its blocks are in the host tier (a bad file is forgotten and its tokens
recomputed). Only the base model's blocks (namespace 0) go to disk: an adapter's id may name another adapter after
a restart. `persist` writes what the tree and the host tier hold at a clean shutdown. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from radixlm.core.block_keys import block_keys
from radixlm.core.block_pool import BlockPool
from radixlm.core.disk_tier import DiskTier
from radixlm.core.host_tier import HostTier, KVTransfers
from radixlm.core.radix_cache import RadixCache
from radixlm.core.radix_node import RadixNode


@dataclass
class OffloadStats:
    """Cumulative: device blocks offloaded to the host, host blocks loaded back, prompt tokens the loads supplied;
    blocks written to and read from disk, and block files found bad (or unwritable)."""

    num_offloaded_blocks: int = 0
    num_loaded_blocks: int = 0
    num_hit_tokens: int = 0
    num_disk_written_blocks: int = 0
    num_disk_read_blocks: int = 0
    num_disk_failed_blocks: int = 0


class KVOffload:
    """Moves blocks between the tree's device blocks and a host tier; `take_transfers` hands each step's copies
    over."""

    def __init__(self, radix_cache: RadixCache, block_pool: BlockPool, host: HostTier,
                 allocate: Callable[[int], list[int] | None], disk: DiskTier | None = None,
                 salt: bytes = b"") -> None:
        """`allocate(n)`: n free device blocks (evicting tree leaves if needed), or None. `salt`: the model's
        identity, which starts every key (needed with a disk tier: its keys outlive the process)."""
        self.radix_cache = radix_cache
        self.block_pool = block_pool
        self.host = host
        self.block_size = radix_cache.block_size
        self.stats = OffloadStats()
        self._allocate = allocate
        self._transfers = KVTransfers()
        self._loading: set[int] = set()  # device blocks this step's loads write
        self._queued_writes: set[bytes] = set()  # keys this step's disk writes name
        self.enabled = True  # off while the tree is reset on purpose: what it drops is not kept
        self.disk = disk
        self.salt = salt
        radix_cache.on_evict = self._offload
        if disk is not None:
            host.on_drop = self._spill
            self._transfers.disk_deletes += disk.take_deletions()

    def _keys(self, token_ids: list[int], namespace: int, num_blocks: int | None = None) -> list[bytes]:
        return block_keys(token_ids, self.block_size, namespace, self.salt, num_blocks)

    def _offload(self, leaf: RadixNode) -> None:
        if not self.enabled:
            return
        namespace, token_ids = self.radix_cache.path_of(leaf)
        first, num_full = leaf.start // self.block_size, leaf.end // self.block_size
        if num_full <= first:
            return
        keys = self._keys(token_ids, namespace, num_full)
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
        keys = self._keys(token_ids, namespace)
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

    def _spill(self, key: bytes, namespace: int, host_block: int) -> None:
        """The host tier drops `key`: write it to disk first (base-model blocks not on disk yet)."""
        if namespace != 0 or not self.enabled:
            return
        self._write(self._transfers, self._queued_writes, key, host_block, from_device=False)

    def _write(self, transfers: KVTransfers, queued: set[bytes], key: bytes, block: int, from_device: bool) -> None:
        """Queue the file of `key` (from a device or a host block) in `transfers` (`queued`: the keys their writes
        name) and keep the disk tier within its budget: a key pushed out loses its file or, when its write is
        still queued, the write (a file written after its delete would be on disk and known to no one)."""
        assert self.disk is not None
        if key in self.disk:
            self.disk.touch(key)
            return
        (transfers.device_saves if from_device else transfers.disk_writes).append((block, key))
        queued.add(key)
        self.stats.num_disk_written_blocks += 1
        for dropped in self.disk.add(key):
            if dropped not in queued:
                transfers.disk_deletes.append(dropped)
                continue
            queued.discard(dropped)
            transfers.disk_writes = [write for write in transfers.disk_writes if write[1] != dropped]
            transfers.device_saves = [save for save in transfers.device_saves if save[1] != dropped]
            self.stats.num_disk_written_blocks -= 1

    def prefetch(self, token_ids: list[int], namespace: int) -> bool:
        """Read the block files that continue the device and host tiers' match of `token_ids` into host blocks
        (this step); True while any of them is still being read: the request waits a step."""
        if self.disk is None or namespace != 0 or not len(self.disk):
            return False
        matched = self.radix_cache.match_length(token_ids, namespace)
        keys = self._keys(token_ids, namespace)
        pending = False
        for key in keys[matched // self.block_size:]:
            if self.host.pin(key) is not None:  # pinned: the reads below must not push it out
                continue
            if self.host.is_reading(key):
                pending = True
                continue
            if key not in self.disk:
                break
            host_block = self.host.reserve(key, namespace)
            if host_block is None:
                break
            self.disk.touch(key)
            self._transfers.disk_reads.append((key, host_block))
            self.stats.num_disk_read_blocks += 1
            pending = True
        return pending

    def finish_transfers(self, transfers: KVTransfers | None, failed_keys: list[bytes]) -> None:
        """The worker applied `transfers`; the block files in `failed_keys` could not be written or read (or were
        bad): forget them. Read blocks join the host tier."""
        failed = set(failed_keys)
        if transfers is not None and transfers.disk_reads:
            self.host.finish_reads(failed)
        if self.disk is not None:
            for key in failed:
                self.disk.discard(key)
        self.stats.num_disk_failed_blocks += len(failed)

    def persist(self) -> KVTransfers:
        """At a clean shutdown, once the pending transfers ran (`take_transfers`): the transfers that write the base
        model's blocks still in the tree and in the host tier (most recently used first, as many as the disk budget
        holds) to disk."""
        if self.disk is None:
            return KVTransfers()
        saves: list[tuple[int, bytes]] = []
        seen: set[bytes] = set()
        for node in sorted(self.radix_cache.nodes(0), key=lambda node: -node.last_access):
            token_ids = self.radix_cache.path_of(node)[1]
            first, num_full = node.start // self.block_size, node.end // self.block_size
            for index, key in enumerate(self._keys(token_ids, 0, num_full)[first:], first):
                if key not in seen and node.block_ids[index - first] not in self._loading:
                    seen.add(key)
                    saves.append((node.block_ids[index - first], key))
        writes = [(block, key) for key, block, namespace in self.host.entries() if namespace == 0 and key not in seen]
        transfers, queued = KVTransfers(), set[bytes]()
        chosen = [(True, *save) for save in saves] + [(False, *write) for write in writes]
        for from_device, block, key in reversed(chosen[:self.disk.num_blocks]):  # least recent first: the most
            self._write(transfers, queued, key, block, from_device)             # recent end up most recently used
        return transfers

    def take_transfers(self) -> KVTransfers | None:
        """The copies the step being handed to the worker must apply first (None when there are none); after
        this, their blocks may be reused."""
        transfers, self._transfers = self._transfers, KVTransfers()
        self._queued_writes = set()
        self._loading.clear()
        self.host.step_handed_over()
        return transfers or None
