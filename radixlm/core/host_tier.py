"""HostTier: the scheduler's view of the host-memory pool under the radix tree.

Full KV blocks the tree evicts from device memory are copied into a pool of `num_blocks` host blocks instead of
being lost, under their content key (`radixlm.core.block_keys`); a later request whose prompt reaches them has them
copied back instead of recomputed. This object only decides which host block holds which key, least recently used
first out; the bytes live in the worker (`radixlm.model.host_kv_cache`) and move by the step's `KVTransfers`.

A host block that the step being built reads (a load) or writes (an offload) is pinned until the step is handed to
the worker: taking it for another key in the same step would overwrite what the step still has to move. Pure
Python, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class KVTransfers:
    """Copies the worker applies before a step's forward, in this order:
    `disk_deletes` (block files beyond the disk budget), `disk_writes` (host block -> file: blocks the host tier
    dropped, written before anything reuses their host block), `device_saves` (device block -> file: the tree's
    blocks at a clean shutdown), `offloads` (device block -> host block: blocks the tree evicted, read before
    anything reuses them), `disk_reads` (file -> host block: checked; a bad one is reported back, see
    `ModelRunnerOutput.kv_failed_keys`), then `loads` (host block -> device block: cached blocks a request's prefix
    reaches). Plain data: it travels in `SchedulerOutput`."""

    offloads: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[int, int]] = field(default_factory=list)
    disk_writes: list[tuple[int, bytes]] = field(default_factory=list)
    device_saves: list[tuple[int, bytes]] = field(default_factory=list)
    disk_reads: list[tuple[bytes, int]] = field(default_factory=list)
    disk_deletes: list[bytes] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.offloads or self.loads or self.disk_writes or self.device_saves or self.disk_reads
                    or self.disk_deletes)


@dataclass
class HostTierStats:
    """Cumulative block counts: stored into the pool, and dropped from it (least recently used, to make room)."""

    num_stored_blocks: int = 0
    num_dropped_blocks: int = 0


class HostTier:
    """Key -> host block, in LRU order, over `num_blocks` host blocks."""

    def __init__(self, num_blocks: int, on_drop: Callable[[bytes, int, int], None] | None = None) -> None:
        """`on_drop(key, namespace, host_block)`: called when a block is dropped to make room, before its host block
        is reused (the disk tier's hook)."""
        if num_blocks < 1:
            raise ValueError(f"a host tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._blocks: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # key -> (host block, namespace)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._pinned: set[int] = set()
        self._released_pinned: list[int] = []  # forgotten while pinned: free once the step is handed over
        self._reading: dict[bytes, tuple[int, int]] = {}  # key -> (host block, namespace) a disk read fills
        self.on_drop = on_drop
        self.stats = HostTierStats()

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def store(self, key: bytes, namespace: int) -> int | None:
        """The host block to copy a device block of content `key` into (pinned), or None: the pool holds the key
        already (now most recently used), or every block is pinned by this step."""
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return None
        block = self._take_block()
        if block is None:
            return None
        self._blocks[key] = (block, namespace)
        self._pinned.add(block)
        self.stats.num_stored_blocks += 1
        return block

    def pin(self, key: bytes) -> int | None:
        """The host block holding `key` (pinned, now most recently used), or None."""
        entry = self._blocks.get(key)
        if entry is None:
            return None
        self._blocks.move_to_end(key)
        self._pinned.add(entry[0])
        return entry[0]

    def reserve(self, key: bytes, namespace: int) -> int | None:
        """A host block for a disk read of `key` (None if every block is pinned): it holds the key only once
        `finish_reads` says the read went well."""
        block = self._take_block()
        if block is not None:
            self._reading[key] = (block, namespace)
        return block

    def is_reading(self, key: bytes) -> bool:
        return key in self._reading

    def reading_keys(self) -> list[bytes]:
        """The keys whose disk reads were handed over and are not finished."""
        return list(self._reading)

    def finish_reads(self, failed: set[bytes]) -> None:
        """The disk reads handed over are done: each key holds its block (most recently used), but those in
        `failed`, whose blocks are free again."""
        for key, (block, namespace) in self._reading.items():
            if key in failed:
                self._free.append(block)
            else:
                self._blocks[key] = (block, namespace)
        self._reading.clear()

    def entries(self) -> list[tuple[bytes, int, int]]:
        """(key, host block, namespace) of every block held, most recently used first."""
        return [(key, block, namespace) for key, (block, namespace) in reversed(self._blocks.items())]

    def step_handed_over(self) -> None:
        """The transfers built so far went to the worker: their blocks may be reused from now on."""
        self._pinned.clear()
        self._free.extend(self._released_pinned)
        self._released_pinned.clear()

    def drop_namespace(self, namespace: int) -> int:
        """Forget every block of `namespace` (an unloaded LoRA adapter: its id may come back for another);
        returns how many."""
        keys = [key for key, (_, owner) in self._blocks.items() if owner == namespace]
        for key in keys:
            self._release(key)
        return len(keys)

    def clear(self) -> None:
        """Forget every block the current step does not pin."""
        for key in [key for key, (block, _) in self._blocks.items() if block not in self._pinned]:
            self._release(key)

    def _release(self, key: bytes) -> None:
        block, _ = self._blocks.pop(key)
        # A pinned one is still being moved: it stays out of the free list until the step is handed over.
        (self._released_pinned if block in self._pinned else self._free).append(block)

    def _take_block(self) -> int | None:
        if self._free:
            return self._free.pop()
        for key, (block, namespace) in self._blocks.items():  # least recently used first; pinned ones are recent
            if block not in self._pinned:
                del self._blocks[key]
                self.stats.num_dropped_blocks += 1
                if self.on_drop is not None:
                    self.on_drop(key, namespace, block)
                self._pinned.add(block)  # its new key's; and a write of the old one may read it this step
                return block
        return None

    @property
    def num_leaked_blocks(self) -> int:
        """Blocks neither free, nor held, nor being moved by a step: 0 unless something is wrong."""
        return self.num_blocks - len(self._blocks) - len(self._free) - len(self._released_pinned) - len(self._reading)

    def check_invariants(self) -> None:
        """Every host block is exactly one of: free, held by one key, forgotten while pinned, or being read."""
        held = [block for block, _ in self._blocks.values()]
        reading = [block for block, _ in self._reading.values()]
        every = sorted(held + self._free + self._released_pinned + reading)
        assert every == list(range(self.num_blocks)), "host blocks lost or held twice"
