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
from dataclasses import dataclass, field


@dataclass
class KVTransfers:
    """Copies the worker applies before a step's forward, in this order: `offloads` (device block -> host block:
    blocks the tree evicted, read before anything reuses them) then `loads` (host block -> device block: cached
    blocks a request's prefix reaches). Plain data: it travels in `SchedulerOutput`."""

    offloads: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.offloads or self.loads)


@dataclass
class HostTierStats:
    """Cumulative block counts: stored into the pool, and dropped from it (least recently used, to make room)."""

    num_stored_blocks: int = 0
    num_dropped_blocks: int = 0


class HostTier:
    """Key -> host block, in LRU order, over `num_blocks` host blocks."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a host tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._blocks: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # key -> (host block, namespace)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._pinned: set[int] = set()
        self._released_pinned: list[int] = []  # forgotten while pinned: free once the step is handed over
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
        for key, (block, _) in self._blocks.items():  # least recently used first; pinned ones are recent
            if block not in self._pinned:
                del self._blocks[key]
                self.stats.num_dropped_blocks += 1
                return block
        return None

    def check_invariants(self) -> None:
        """Every host block is exactly one of: free, held by one key, or forgotten while pinned."""
        held = [block for block, _ in self._blocks.values()]
        every = sorted(held + self._free + self._released_pinned)
        assert every == list(range(self.num_blocks)), "host blocks lost or held twice"
