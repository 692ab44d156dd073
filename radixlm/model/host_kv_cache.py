"""HostKVCache: the bytes of the host tier under the radix tree (`radixlm.core.host_tier` decides what they hold).

Every tensor of the device cache (`PagedKVCache.tensors()`: each layer's keys and values, an int8 cache's scales)
has a host twin of `num_blocks` blocks with the same per-slot layout, so a block moves as one `[block_size, ...]`
slice of each. On a GPU the host tensors are pinned, for copies the device can run on its own.
"""

from __future__ import annotations

import logging
import time

import torch

from radixlm.core.host_tier import KVTransfers
from radixlm.model.kv_cache import PagedKVCache

logger = logging.getLogger(__name__)


class HostKVCache:
    """`num_blocks` blocks of host memory for the KV blocks of `kv_cache`."""

    def __init__(self, kv_cache: PagedKVCache, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = kv_cache.block_size
        pin = kv_cache.device.type == "cuda"
        # Zeroed, so the memory is committed now, as the device cache's is.
        self.tensors = [torch.zeros((num_blocks * self.block_size, *t.shape[1:]), dtype=t.dtype, pin_memory=pin)
                        for t in kv_cache.tensors()]
        num_bytes = sum(t.numel() * t.element_size() for t in self.tensors)
        self.bytes_per_block = num_bytes // num_blocks
        logger.info("KV host tier: %d blocks x %d tokens = %d tokens, %.1f MiB", num_blocks, self.block_size,
                    num_blocks * self.block_size, num_bytes / 2**20)

    def apply(self, kv_cache: PagedKVCache, transfers: KVTransfers) -> float:
        """Offloads (device -> host), then loads (host -> device), in every tensor; returns the seconds taken."""
        start = time.perf_counter()
        device = kv_cache.device
        if transfers.offloads:
            sources = torch.tensor([pair[0] for pair in transfers.offloads], device=device)
            targets = torch.tensor([pair[1] for pair in transfers.offloads])
            for host_tensor, device_tensor in zip(self.tensors, kv_cache.tensors(), strict=True):
                self._blocks(host_tensor)[targets] = self._blocks(device_tensor)[sources].cpu()
        if transfers.loads:
            latest = {device_block: host_block for host_block, device_block in transfers.loads}  # the last load wins
            sources = torch.tensor(list(latest.values()))
            targets = torch.tensor(list(latest), device=device)
            for host_tensor, device_tensor in zip(self.tensors, kv_cache.tensors(), strict=True):
                self._blocks(device_tensor)[targets] = self._blocks(host_tensor)[sources].to(device)
        return time.perf_counter() - start

    def _blocks(self, tensor: torch.Tensor) -> torch.Tensor:
        """`[num_slots, ...]` as `[num_blocks, block_size, ...]` (a view)."""
        return tensor.view(-1, self.block_size, *tensor.shape[1:])
