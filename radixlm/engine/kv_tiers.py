"""The engine's side of the KV tiers under the radix tree (host memory, `--kv-offload-memory`; disk,
`--kv-offload-dir`): the cache manager built with them, the save of the cached prefixes at a clean shutdown, and
what `/metrics` shows of them (read at scrape time)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from radixlm.config import EngineConfig
from radixlm.core.disk_tier import DiskTier, list_block_files
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.step import SchedulerOutput
from radixlm.metrics import ScrapeSample
from radixlm.model.model_identity import block_file_directory, model_identity
from radixlm.worker.worker import WorkerInfo

if TYPE_CHECKING:
    from radixlm.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


def build_kv_cache_manager(config: EngineConfig, info: WorkerInfo, model_dir: Path) -> KVCacheManager:
    """The block pool, the radix tree and the tiers under it the config asks for (the worker sized the host tier;
    the disk tier starts with the block files a previous server of the same model left)."""
    cache = config.cache
    disk, identity = None, b""
    if cache.kv_offload_dir is not None and info.num_host_blocks > 0:
        identity = model_identity(model_dir, config.model, cache)
        directory = block_file_directory(cache, identity)
        found = list_block_files(directory)
        num_blocks = cache.kv_offload_disk_num_bytes // max(1, info.kv_bytes_per_block)
        if num_blocks < 1:
            raise ValueError(f"kv_offload_disk_bytes {cache.kv_offload_disk_bytes!r} holds no block of "
                             f"{info.kv_bytes_per_block} bytes")
        disk = DiskTier(num_blocks, found)
        logger.info("KV disk tier: %s holds %d block files of this model (budget %d blocks)", directory,
                    len(found), disk.num_blocks)
    return KVCacheManager(info.num_kv_blocks, cache.block_size, cache.enable_prefix_caching, info.num_host_blocks,
                          disk, identity)


def persist_kv_tiers(engine: LLMEngine) -> None:
    """At a clean shutdown (no request live): write the cached prefixes to the disk tier, if there is one. A
    failure is logged: it loses a cache, not the shutdown."""
    manager = engine.scheduler.kv_cache_manager
    try:
        if manager.offload is None or manager.offload.disk is None:
            return
        pending = manager.take_transfers()  # first, so that the host blocks they fill are written filled
        if pending:
            manager.finish_transfers(pending, engine.worker.execute_model(SchedulerOutput(kv_transfers=pending))
                                     .kv_failed_keys)
        transfers = manager.persist_transfers()
        if transfers is None:
            return
        output = engine.worker.execute_model(SchedulerOutput(kv_transfers=transfers))
    except Exception:
        logger.exception("saving the KV cache to the disk tier failed")
        return
    num_saved = len(transfers.device_saves) + len(transfers.disk_writes) - len(output.kv_failed_keys)
    logger.info("saved %d KV blocks of cached prefixes to the disk tier", num_saved)


def kv_tier_samples(engine: LLMEngine) -> list[ScrapeSample]:
    """The host tier's size and traffic (none without a host tier). Counters are cumulative; bytes are one
    worker's (one rank's share under tensor parallelism); the mean load latency is seconds over steps."""
    offload = engine.scheduler.kv_cache_manager.offload
    if offload is None:
        return []
    host, stats = offload.host, offload.stats
    bytes_per_block = engine.worker_info.kv_bytes_per_block
    samples = [] if offload.disk is None else [
        ScrapeSample("gauge", "radixlm:kv_disk_used_blocks", "Block files the disk tier holds.", len(offload.disk)),
        ScrapeSample("gauge", "radixlm:kv_disk_leaked_files",
                     "Block files of this model on disk that the disk tier does not know: 0 once idle, unless a "
                     "delete failed.", _num_leaked_files(engine))]
    return samples + [
        ScrapeSample("gauge", "radixlm:kv_host_capacity_blocks", "Blocks the host tier holds (--kv-offload-memory).",
                     host.num_blocks),
        ScrapeSample("gauge", "radixlm:kv_host_used_blocks", "Blocks the host tier holds now.", len(host)),
        ScrapeSample("counter", "radixlm:host_cache_hit_tokens",
                     "Prompt tokens loaded back from the host tier instead of computed.", stats.num_hit_tokens),
        ScrapeSample("counter", "radixlm:kv_offloaded_bytes", "Bytes of evicted KV blocks copied to the host tier.",
                     stats.num_offloaded_blocks * bytes_per_block),
        ScrapeSample("counter", "radixlm:kv_loaded_bytes", "Bytes of KV blocks copied back from the host tier.",
                     stats.num_loaded_blocks * bytes_per_block),
        ScrapeSample("counter", "radixlm:kv_host_dropped_blocks",
                     "Blocks the host tier dropped (least recently used) to make room.", host.stats.num_dropped_blocks),
        ScrapeSample("gauge", "radixlm:kv_host_leaked_blocks",
                     "Host-tier blocks neither free nor holding a block nor being moved: 0 unless something is wrong.",
                     host.num_leaked_blocks),
        ScrapeSample("counter", "radixlm:kv_disk_written_blocks", "Blocks written to the disk tier.",
                     stats.num_disk_written_blocks),
        ScrapeSample("counter", "radixlm:kv_disk_read_blocks", "Blocks read back from the disk tier.",
                     stats.num_disk_read_blocks),
        ScrapeSample("counter", "radixlm:kv_disk_failed_blocks",
                     "Block files that could not be written or read, or were bad (their tokens recomputed).",
                     stats.num_disk_failed_blocks),
        ScrapeSample("counter", "radixlm:kv_transfer_seconds",
                     "Seconds the worker spent on host-tier copies (before the forward of their steps).",
                     engine.kv_transfer_seconds),
        ScrapeSample("counter", "radixlm:kv_transfer_steps", "Steps that had host-tier copies.",
                     engine.num_kv_transfer_steps),
    ]


def _num_leaked_files(engine: LLMEngine) -> int:
    offload = engine.scheduler.kv_cache_manager.offload
    assert offload is not None and offload.disk is not None
    on_disk = list_block_files(block_file_directory(engine.config.cache, offload.salt))
    return sum(key not in offload.disk for key in on_disk)
