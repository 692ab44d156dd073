"""One decode step's attention (all layers), C++ kernel vs torch path, next to the
memory bound: the K/V bytes the step reads over the read bandwidth of those very caches, measured in the same run by a
streaming reduction over them (`read_seconds`; a fresh buffer's bandwidth varied 2-3x between allocations here).

Synthetic caches of a given model shape (default SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads, D=64); each
request's context is its own run of blocks, or, with a shared prefix, every request starts with the same blocks
(as the radix cache shares them) followed by its own. Layers cycle over a few distinct caches, enough to exceed the
CPU caches, so every layer reads from memory as in the engine.

    .venv/bin/python benchmarks/attention.py [--batch-size 64] [--context-lens 256,1024] [--num-threads N]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from radixlm.bench.step_probe import read_seconds
from radixlm.core.step import ScheduledChunk
from radixlm.model.attention import AttentionMetadata, create_backend, paged_attention
from radixlm.model.input_batch import InputBatch
from radixlm.model.kv_cache import PagedKVCache


@dataclass(frozen=True)
class AttentionShape:
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    block_size: int = 16
    distinct_layers: int = 4  # caches actually allocated; layer i reads cache i % distinct_layers


class _Layer(torch.nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def _step_metadata(shape: AttentionShape, batch: int, context_len: int, shared_prefix: int, kv_dtype: torch.dtype,
                   kernel: bool) -> tuple[PagedKVCache, AttentionMetadata]:
    """Caches filled with random K/V and one decode step's metadata: `batch` requests of `context_len` tokens whose
    first `shared_prefix` tokens (whole blocks) live in the same blocks."""
    bs = shape.block_size
    shared_blocks = shared_prefix // bs
    own_blocks = -(-context_len // bs) - shared_blocks
    num_blocks = shared_blocks + batch * own_blocks
    cache = PagedKVCache(shape.distinct_layers, num_blocks, bs, shape.num_kv_heads, shape.head_dim, kv_dtype)
    for tensor in (*cache.key_caches, *cache.value_caches):
        tensor.copy_(torch.randn(tensor.shape))
    shared = list(range(shared_blocks))
    chunks = []
    for b in range(batch):
        first = shared_blocks + b * own_blocks
        chunks.append(ScheduledChunk(f"r{b}", [1], context_len - 1, shared + list(range(first, first + own_blocks)),
                                     num_sampled=1))
    tables = {chunk.request_id: chunk.new_block_ids for chunk in chunks}
    attention = create_backend("cpp" if kernel else "torch")
    return cache, InputBatch.build(chunks, tables, cache, attention=attention).attn_metadata


def time_decode_step(shape: AttentionShape, batch: int, context_len: int, shared_prefix: int, kv_dtype: torch.dtype,
                     kernel: bool, repeats: int) -> tuple[float, float]:
    """Best wall time of one decode step's attention over `shape.num_layers` layers, and the read bandwidth of its
    caches (bytes per second), each the best of `repeats` alternating runs."""
    cache, metadata = _step_metadata(shape, batch, context_len, shared_prefix, kv_dtype, kernel)
    caches = [*cache.key_caches, *cache.value_caches]
    cache_bytes = sum(t.numel() * t.element_size() for t in caches)
    query = torch.randn(1, shape.num_heads, batch, shape.head_dim)
    key, value = torch.randn(2, 1, shape.num_kv_heads, batch, shape.head_dim)
    layers = [_Layer(i % shape.distinct_layers) for i in range(shape.num_layers)]

    def step() -> None:
        for layer in layers:
            paged_attention(layer, query, key, value, None, scaling=shape.head_dim ** -0.5, radix_attn=metadata)

    best_step = best_read = float("inf")
    with torch.inference_mode():
        step()  # warm-up: first touch of the pages, thread pool start
        for _ in range(repeats):
            best_step = min(best_step, _timed(step))
            best_read = min(best_read, read_seconds(caches, repeats=1))
    return best_step, cache_bytes / best_read


def bench_attention(batch: int, context_lens: list[int], repeats: int, torch_repeats: int) -> None:
    """Print one row per (context, shared prefix, backend, K/V dtype): step time, bytes read, the caches' read
    bandwidth, the memory bound and the step time over it. Shared prefixes: none, and half the context."""
    shape = AttentionShape()
    print(f"{torch.get_num_threads()} threads; B={batch}, {shape.num_layers} layers, Hq={shape.num_heads}, "
          f"Hkv={shape.num_kv_heads}, D={shape.head_dim}")
    print(f"{'context':>7} {'shared':>6} {'backend':>7} {'kv':>8} {'ms/step':>8} {'MB read':>8} {'GB/s':>5} "
          f"{'bound ms':>8} {'x bound':>7}")
    for context_len in context_lens:
        for shared_prefix in (0, context_len // 2 // shape.block_size * shape.block_size):
            for backend, kv_dtype in (("torch", torch.float32), ("cpp", torch.float32), ("cpp", torch.bfloat16)):
                seconds, bandwidth = time_decode_step(shape, batch, context_len, shared_prefix, kv_dtype,
                                                      backend == "cpp", repeats if backend == "cpp" else torch_repeats)
                num_bytes = (2 * shape.num_layers * batch * context_len * shape.num_kv_heads * shape.head_dim
                             * kv_dtype.itemsize)
                bound = num_bytes / bandwidth
                print(f"{context_len:>7} {shared_prefix:>6} {backend:>7} {str(kv_dtype)[6:]:>8} "
                      f"{seconds * 1e3:>8.1f} {num_bytes / 1e6:>8.0f} {bandwidth / 1e9:>5.1f} {bound * 1e3:>8.1f} "
                      f"{seconds / bound:>7.2f}")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags (`argv`, default the command line) and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--context-lens", default="256,1024", help="comma-separated context lengths")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per C++ case (best is shown)")
    parser.add_argument("--torch-repeats", type=int, default=2, help="timed steps per torch case")
    parser.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    bench_attention(args.batch_size, [int(n) for n in args.context_lens.split(",") if n], args.repeats,
                    args.torch_repeats)


if __name__ == "__main__":
    main()
