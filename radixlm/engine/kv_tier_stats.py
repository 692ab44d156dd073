"""What `/metrics` shows of the host tier under the radix tree (`--kv-offload-memory`), read at scrape time."""

from __future__ import annotations

from radixlm.engine.llm_engine import LLMEngine
from radixlm.metrics import ScrapeSample


def kv_tier_samples(engine: LLMEngine) -> list[ScrapeSample]:
    """The host tier's size and traffic (none without a host tier). Counters are cumulative; bytes are one
    worker's (one rank's share under tensor parallelism); the mean load latency is seconds over steps."""
    offload = engine.scheduler.kv_cache_manager.offload
    if offload is None:
        return []
    host, stats = offload.host, offload.stats
    bytes_per_block = engine.worker_info.kv_bytes_per_block
    return [
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
        ScrapeSample("counter", "radixlm:kv_transfer_seconds",
                     "Seconds the worker spent on host-tier copies (before the forward of their steps).",
                     engine.kv_transfer_seconds),
        ScrapeSample("counter", "radixlm:kv_transfer_steps", "Steps that had host-tier copies.",
                     engine.num_kv_transfer_steps),
    ]
