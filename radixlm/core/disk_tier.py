"""DiskTier: the scheduler's view of the disk tier under the host tier (`--kv-offload-dir`).

Full blocks the host tier drops are written to files instead of lost, one file per block named by its content key
(`radixlm.core.block_keys`, chained from the model's identity, so that keys and files outlive the process); a prompt
that reaches them has them read back into host blocks, and from there into device blocks like any host block. This
object only knows which keys have a file, least recently used first, within a budget of blocks; the files are
written, read, checked and deleted by the worker (`radixlm.model.disk_kv_store`), as the step's transfers say, and a
key whose file turns out bad is forgotten. Pure Python, no torch.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

FILE_SUFFIX = ".kv"


def list_block_files(directory: Path) -> list[bytes]:
    """The keys of the block files in `directory`, least recently written first (none if it does not exist)."""
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.endswith(FILE_SUFFIX) and entry.is_file()]
    except FileNotFoundError:
        return []
    dated = []
    for entry in entries:
        try:
            dated.append((entry.stat().st_mtime, bytes.fromhex(entry.name[:-len(FILE_SUFFIX)])))
        except (OSError, ValueError):
            continue  # gone since the listing, or not one of ours
    return [key for _, key in sorted(dated)]


class DiskTier:
    """Keys with a block file, in LRU order, at most `num_blocks` of them."""

    def __init__(self, num_blocks: int, existing: Iterable[bytes] = ()) -> None:
        """`existing`: keys found on disk at start-up, least recently written first (beyond the budget, the oldest
        are deleted by the first step)."""
        self.num_blocks = max(0, num_blocks)
        self._keys: OrderedDict[bytes, None] = OrderedDict()
        self._to_delete: list[bytes] = []
        for key in existing:
            self._to_delete += self.add(key)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[bytes]:
        """Every key, least recently used first."""
        return list(self._keys)

    def add(self, key: bytes) -> list[bytes]:
        """`key` gets (or has) a file, now the most recently used; returns the keys whose files must go to stay
        within the budget (least recently used first)."""
        self._keys[key] = None
        self._keys.move_to_end(key)
        dropped = []
        while len(self._keys) > self.num_blocks:
            dropped.append(self._keys.popitem(last=False)[0])
        return dropped

    def touch(self, key: bytes) -> None:
        if key in self._keys:
            self._keys.move_to_end(key)

    def discard(self, key: bytes) -> None:
        """Forget a key whose file could not be written or read."""
        self._keys.pop(key, None)

    def take_deletions(self) -> list[bytes]:
        """Keys dropped before any step could delete their files (start-up beyond the budget)."""
        deletions, self._to_delete = self._to_delete, []
        return deletions
