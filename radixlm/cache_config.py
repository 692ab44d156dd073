"""The KV cache's configuration: blocks, budget, storage dtype, prefix caching and the tiers below it (host memory,
disk); frozen and validated, part of `radixlm.config.EngineConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.config_values import help_text as _help
from radixlm.config_values import parse_bytes, parse_memory

KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "bfloat16", "int8")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = field(default=16, metadata=_help("tokens per KV cache block"))
    kv_cache_memory: float | str = field(default=0.1, metadata=_help(
        "KV cache budget: a fraction of free memory (0 < x <= 1) or bytes ('512MiB', '2GB', 300000000)"))
    num_kv_blocks: int | None = field(default=None, metadata=_help(
        "exact number of KV blocks (overrides --kv-cache-memory; mostly for tests)"))
    enable_prefix_caching: bool = field(default=True, metadata=_help(
        "reuse the K/V of shared prompt prefixes through the radix tree (--disable-radix-cache turns it off)"))
    kv_cache_dtype: str = field(default="auto", metadata=_help(
        "KV cache storage: auto (the model dtype), bfloat16 (half the bytes of float32) or int8 (a float16 scale per "
        "token and KV head: 1.9x bfloat16's tokens in the same memory); compute stays in the model dtype"))
    kv_offload_memory: float | str = field(default=0, metadata=_help(
        "host tier under the radix tree: KV blocks it evicts are copied to this much host memory (bytes, or a "
        "fraction of free memory after the KV cache) instead of being dropped, and loaded back when a prompt "
        "reaches them; 0 turns it off. Needs prefix caching"))
    kv_offload_dir: str | None = field(default=None, metadata=_help(
        "disk tier under the host tier: blocks the host tier drops are written here (a directory per model "
        "identity) and read back when a prompt reaches them; a clean shutdown saves the cached prefixes, and a "
        "restarted server on the same model finds them. Needs --kv-offload-memory"))
    kv_offload_disk_bytes: str | int = field(default="16GiB", metadata=_help(
        "most bytes of block files under --kv-offload-dir (least recently used deleted first)"))
    grammar_cache_bytes: str | int = field(default="512MiB", metadata=_help(
        "most bytes of compiled grammars (structured outputs, forced tool calls) kept for reuse, least recently "
        "used evicted first; a grammar larger than this is refused (400). Each data-parallel replica has its own"))

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 1, got {self.block_size}")
        parse_memory(self.kv_cache_memory)
        if self.kv_offload_memory != 0:
            parse_memory(self.kv_offload_memory, "kv_offload_memory")
        parse_bytes(self.kv_offload_disk_bytes, "kv_offload_disk_bytes")
        if self.kv_offload_dir is not None:
            if not self.kv_offload_dir.strip():
                raise ValueError("kv_offload_dir must name a directory")
            if self.kv_offload_memory == 0 or not self.enable_prefix_caching:
                raise ValueError("kv_offload_dir is the tier under the host tier: it needs kv_offload_memory > 0 "
                                 "and prefix caching")
        parse_bytes(self.grammar_cache_bytes, "grammar_cache_bytes")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")

    @property
    def kv_offload_disk_num_bytes(self) -> int:
        return parse_bytes(self.kv_offload_disk_bytes, "kv_offload_disk_bytes")

    @property
    def grammar_cache_num_bytes(self) -> int:
        return parse_bytes(self.grammar_cache_bytes, "grammar_cache_bytes")
