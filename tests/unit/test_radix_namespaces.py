"""Prefixes cached under one LoRA adapter (a radix-tree namespace) are never matched under another; removing a
namespace gives its blocks back and leaves the others alone. No model, no torch."""

from __future__ import annotations

from radixlm.core.block_pool import BlockPool
from radixlm.core.radix_cache import RadixCache


def cached(cache: RadixCache, pool: BlockPool, token_ids: list[int], namespace: int) -> None:
    blocks = pool.allocate(-(-len(token_ids) // cache.block_size))
    cache.insert(token_ids, blocks, namespace)
    pool.free(blocks)  # the tree keeps its own references


def test_the_same_tokens_under_two_namespaces_never_match():
    pool = BlockPool(32)
    cache = RadixCache(pool, 4)
    tokens = list(range(10))
    cached(cache, pool, tokens, namespace=0)
    assert cache.match_length(tokens, 0) == 10
    assert cache.match_length(tokens, 7) == 0 and cache.match_prefix(tokens, 7).num_tokens == 0
    cached(cache, pool, tokens, namespace=7)
    assert cache.match_prefix(tokens, 7).block_ids != cache.match_prefix(tokens, 0).block_ids
    cache.check_invariants()


def test_removing_a_namespace_frees_its_blocks_only():
    pool = BlockPool(32)
    cache = RadixCache(pool, 4)
    cached(cache, pool, list(range(10)), namespace=0)
    cached(cache, pool, list(range(10)), namespace=3)
    cached(cache, pool, [*range(8), 50, 51], namespace=3)  # a branch inside namespace 3
    used = pool.num_used_blocks
    freed = cache.remove_namespace(3)
    assert freed > 0 and pool.num_used_blocks == used - freed
    assert cache.match_length(list(range(10)), 3) == 0 and cache.match_length(list(range(10)), 0) == 10
    cache.check_invariants()
    cache.reset()
    assert pool.num_free_blocks == pool.num_blocks  # the removed nodes' stale heap entries freed nothing twice
    assert cache.remove_namespace(3) == 0


def test_eviction_is_one_lru_over_every_namespace():
    pool = BlockPool(8)
    cache = RadixCache(pool, 4)
    cached(cache, pool, list(range(8)), namespace=1)   # older
    cached(cache, pool, list(range(8)), namespace=2)   # newer
    cache.evict(2)
    assert cache.match_length(list(range(8)), 1) == 0 and cache.match_length(list(range(8)), 2) == 8
    cache.check_invariants()
