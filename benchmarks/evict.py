"""The radix cache's eviction (a heap kept as the tree changes) against a walk over every leaf.

A server whose cache is full evicts on almost every allocation that comes up short: each new block of a decode,
each prefill chunk. The walk costs O(nodes) per call, the heap O(log nodes) per evicted leaf. Both run on copies of
the same tree (many conversations on a shared system prompt), evicting one block at a time, and must leave the same
tree behind. Pure Python, no model.

    .venv/bin/python benchmarks/evict.py [--num-blocks 3000,30000,300000] [--tokens-per-request 256]
"""

from __future__ import annotations

import argparse
import copy
import heapq
import random
import statistics
import time

from radixlm.core.block_pool import BlockPool
from radixlm.core.radix_cache import RadixCache

BLOCK_SIZE = 16
SHARED_PREFIX_TOKENS = 64
MAX_BLOCKS = 10_000_000  # the pool keeps two Python lists of this length


def evict_by_full_scan(cache: RadixCache, num_blocks: int) -> int:
    """`cache.evict(num_blocks)` as a walk over every leaf (the rule the heap must follow): the unlocked leaves in
    least-recently-used order, a parent left childless joining them. Returns the blocks freed."""
    pool, free_before = cache.block_pool, cache.block_pool.num_free_blocks
    heap = [(leaf.last_access, id(leaf), leaf) for leaf in cache._leaves() if leaf.lock_ref == 0]
    heapq.heapify(heap)
    while heap and pool.num_free_blocks - free_before < num_blocks:
        _, _, leaf = heapq.heappop(heap)
        parent = leaf.parent
        assert parent is not None
        del parent.children[leaf.token_ids[0]]
        leaf.parent = None
        pool.free(leaf.block_ids)
        cache.num_nodes -= 1
        cache.num_tokens -= len(leaf.token_ids)
        if parent is not cache.root and not parent.children and parent.lock_ref == 0:
            heapq.heappush(heap, (parent.last_access, id(parent), parent))
    return pool.num_free_blocks - free_before


def tree_of(cache: RadixCache) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """The tree as sorted (start, edge tokens, blocks) of its nodes: equal trees give equal lists."""
    return sorted((node.start, tuple(node.token_ids), tuple(node.block_ids)) for node in cache._nodes())


def full_cache(num_blocks: int, tokens_per_request: int, seed: int) -> RadixCache:
    """A cache whose tree holds every block: requests of `tokens_per_request` random tokens after a 64-token shared
    prefix, inserted until the pool is empty, each touched again at random so the LRU order is not insertion order."""
    rng = random.Random(seed)
    pool = BlockPool(num_blocks)
    cache = RadixCache(pool, BLOCK_SIZE)
    prefix = list(range(SHARED_PREFIX_TOKENS))
    requests = []
    blocks_per_request = -(-tokens_per_request // BLOCK_SIZE)
    while pool.num_free_blocks >= blocks_per_request:
        tokens = prefix + [rng.randrange(100, 50_000) for _ in range(tokens_per_request - len(prefix))]
        blocks = pool.allocate(blocks_per_request)
        cache.insert(tokens, blocks)
        pool.free(blocks)  # only the tree holds them now, as after the request finished
        requests.append(tokens)
    for tokens in rng.sample(requests, len(requests) // 2):
        cache.match_prefix(tokens)
    return cache


def check_options(sizes: list[int], tokens_per_request: int, num_evictions: int) -> None:
    """ValueErrors naming the flag: each size in [1, MAX_BLOCKS], a request longer than the shared prefix by at least
    a block (and at most a pool), at least one eviction."""
    if not sizes or any(not 1 <= size <= MAX_BLOCKS for size in sizes):
        raise ValueError(f"--num-blocks must list sizes in [1, {MAX_BLOCKS}], got {sizes}")
    low, high = SHARED_PREFIX_TOKENS + BLOCK_SIZE, min(sizes) * BLOCK_SIZE
    if not low <= tokens_per_request <= max(low, high):
        raise ValueError(f"--tokens-per-request must be in [{low}, {max(low, high)}], got {tokens_per_request}")
    if num_evictions < 1:
        raise ValueError(f"--num-evictions must be >= 1, got {num_evictions}")


def bench_evict(sizes: list[int], tokens_per_request: int, num_evictions: int, seed: int) -> None:
    """Print a table row per pool size: median microseconds per evict(1), heap and full scan, and whether both
    left the same tree. ValueError (naming the flag) for options `check_options` refuses."""
    check_options(sizes, tokens_per_request, num_evictions)
    print("| blocks | nodes | heap, us per evict(1) | full scan, us | scan / heap | same tree |")
    print("|---|---|---|---|---|---|")
    for num_blocks in sizes:
        cache = full_cache(num_blocks, tokens_per_request, seed)
        scanned, num_nodes = copy.deepcopy(cache), cache.num_nodes
        heap_times, scan_times = [], []
        for _ in range(num_evictions):  # alternated, one block at a time, as allocations ask for them
            start = time.perf_counter()
            cache.evict(1)
            heap_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            evict_by_full_scan(scanned, 1)
            scan_times.append(time.perf_counter() - start)
        heap_us, scan_us = 1e6 * statistics.median(heap_times), 1e6 * statistics.median(scan_times)
        same = tree_of(cache) == tree_of(scanned)
        print(f"| {num_blocks} | {num_nodes} | {heap_us:.1f} | {scan_us:.1f} | {scan_us / heap_us:.0f}x | "
              f"{'yes' if same else 'NO'} |")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags (`argv`, default the command line) and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-blocks", default="3000,30000,300000", help="comma-separated KV pool sizes")
    parser.add_argument("--tokens-per-request", type=int, default=256, help="cached tokens per finished request")
    parser.add_argument("--num-evictions", type=int, default=200, help="timed evict(1) calls per size")
    parser.add_argument("--workload-seed", type=int, default=0)
    args = parser.parse_args(argv)
    bench_evict([int(n) for n in args.num_blocks.split(",") if n], args.tokens_per_request, args.num_evictions,
                args.workload_seed)


if __name__ == "__main__":
    main()
