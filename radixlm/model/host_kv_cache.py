"""HostKVCache: the bytes of the host tier under the radix tree (`radixlm.core.host_tier` decides what they hold),
and the worker's end of the disk tier below it (`radixlm.model.disk_kv_store`).

Every tensor of the device cache (`PagedKVCache.tensors()`: each layer's keys and values, an int8 cache's scales)
has a host twin of `num_blocks` blocks with the same per-slot layout, so a block moves as one `[block_size, ...]`
slice of each. On a GPU the host tensors are pinned, for copies the device can run on its own.
"""

from __future__ import annotations

import logging
import time

import psutil
import torch

from radixlm.core.host_tier import KVTransfers
from radixlm.model.disk_kv_store import DiskKVStore
from radixlm.model.kv_cache import PagedKVCache

logger = logging.getLogger(__name__)

HEADROOM = 0.9  # the most of the free memory a fractional --kv-offload-memory takes: the system needs the rest


class HostKVCache:
    """`num_blocks` blocks of host memory for the KV blocks of `kv_cache`, and the disk tier's files below them."""

    def __init__(self, kv_cache: PagedKVCache, num_blocks: int, disk: DiskKVStore | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = kv_cache.block_size
        self.disk = disk
        num_bytes = num_blocks * sum(t[0].numel() * t.element_size() for t in kv_cache.tensors()) * self.block_size
        available = psutil.virtual_memory().available
        if num_bytes > available:
            raise ValueError(f"kv_offload_memory: {num_bytes / 2**30:.1f} GiB of host blocks, but only "
                             f"{available / 2**30:.1f} GiB of memory is free")
        pin = kv_cache.device.type == "cuda"
        # Zeroed, so the memory is committed now, as the device cache's is.
        self.tensors = [torch.zeros((num_blocks * self.block_size, *t.shape[1:]), dtype=t.dtype, pin_memory=pin)
                        for t in kv_cache.tensors()]
        num_bytes = sum(t.numel() * t.element_size() for t in self.tensors)
        logger.info("KV host tier: %d blocks x %d tokens = %d tokens, %.1f MiB%s", num_blocks, self.block_size,
                    num_blocks * self.block_size, num_bytes / 2**20,
                    f"; block files in {disk.directory}" if disk is not None else "")

    def apply(self, kv_cache: PagedKVCache, transfers: KVTransfers) -> tuple[float, list[bytes]]:
        """Every copy of `transfers`, in their order (see `KVTransfers`); returns the seconds taken and the keys of
        the block files that could not be written or read."""
        start = time.perf_counter()
        failed: list[bytes] = []
        disk = self.disk
        for key in transfers.disk_deletes:
            if disk is not None:
                disk.delete(key)
        for tensors, writes in ((self.tensors, transfers.disk_writes), (kv_cache.tensors(), transfers.device_saves)):
            for block, key in writes:
                if disk is None or not disk.write(key, [part.cpu() for part in self._block(tensors, block)]):
                    failed.append(key)
        if transfers.offloads:
            sources = torch.tensor([pair[0] for pair in transfers.offloads], device=kv_cache.device)
            targets = torch.tensor([pair[1] for pair in transfers.offloads])
            for host_tensor, device_tensor in zip(self.tensors, kv_cache.tensors(), strict=True):
                self._blocks(host_tensor)[targets] = self._blocks(device_tensor)[sources].cpu()
        for key, block in transfers.disk_reads:
            if disk is None or not disk.read(key, self._block(self.tensors, block)):
                failed.append(key)
        if transfers.loads:
            latest = {device_block: host_block for host_block, device_block in transfers.loads}  # the last load wins
            sources = torch.tensor(list(latest.values()))
            targets = torch.tensor(list(latest), device=kv_cache.device)
            for host_tensor, device_tensor in zip(self.tensors, kv_cache.tensors(), strict=True):
                self._blocks(device_tensor)[targets] = self._blocks(host_tensor)[sources].to(kv_cache.device)
        return time.perf_counter() - start, failed

    def _blocks(self, tensor: torch.Tensor) -> torch.Tensor:
        """`[num_slots, ...]` as `[num_blocks, block_size, ...]` (a view)."""
        return tensor.view(-1, self.block_size, *tensor.shape[1:])

    def _block(self, tensors: list[torch.Tensor], block: int) -> list[torch.Tensor]:
        """Block `block` of each tensor (views)."""
        return [tensor[block * self.block_size:(block + 1) * self.block_size] for tensor in tensors]
