"""Radix cache: unit tests and a hypothesis state machine that also checks the cached K/V *contents*.

The state machine simulates K/V with a fake store: the "K/V" of position p of a token sequence is the hash of the
sequence up to p. Requests write their computed positions into their slots; a prefix hit must find the right
contents in the blocks it is given (after the copy-on-write copies), and no shared slot may ever be overwritten.
"""

import copy

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from benchmarks.evict import bench_evict, evict_by_full_scan, tree_of
from radixlm.core.block_pool import BlockPool
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.radix_cache import RadixCache
from radixlm.request import Request
from radixlm.sampling_params import SamplingParams

BS = 4


def make_cache(num_blocks=16):
    pool = BlockPool(num_blocks)
    return pool, RadixCache(pool, BS)


def test_match_returns_blocks_of_the_inserted_prefix():
    pool, cache = make_cache()
    blocks = pool.allocate(3)
    cache.insert(list(range(10)), blocks)
    match = cache.match_prefix(list(range(7)) + [99])
    assert match.num_tokens == 7 and match.block_ids == blocks[:2]
    assert cache.match_length([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == 10
    cache.check_invariants()


def test_branch_inside_a_block_uses_the_child_block_for_the_shared_index():
    pool, cache = make_cache()
    first = pool.allocate(3)   # tokens 0..9
    cache.insert(list(range(10)), first)
    second = [first[0]] + pool.allocate(2)  # shares block 0, diverges at position 6 (inside block 1)
    cache.insert([0, 1, 2, 3, 4, 5, 50, 51, 52], second)
    cache.check_invariants()
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 50, 51, 52, 9]).block_ids == second[:3]
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 6, 7]).block_ids == first[:2]
    # the block at the branch point is held by the parent part and by both children
    assert pool.ref_count(first[1]) == 1 + 2  # the request's own ref + upper part + lower part


def test_lock_protects_from_eviction_and_lru_order():
    pool, cache = make_cache(num_blocks=4)
    old = pool.allocate(2)
    cache.insert([1] * 8, old)
    new = pool.allocate(2)
    cache.insert([2] * 8, new)
    pool.free(old + new)  # only the tree holds them now
    cache.match_prefix([1] * 8)  # touch: [2]*8 becomes least recently used
    assert cache.evict(1) == 2 and cache.match_length([2] * 8) == 0 and cache.match_length([1] * 8) == 8
    node = cache.match_prefix([1] * 8).node
    cache.lock(node)
    assert cache.evict(4) == 0
    cache.unlock(node)
    assert cache.evict(4) == 2 and pool.num_free_blocks == 4
    with pytest.raises(ValueError, match="unlock"):
        cache.unlock(node)


def test_manager_copies_partial_block_and_shares_full_ones():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    first = Request("a", list(range(11)), SamplingParams())
    assert kv.allocate_with_prefix(first, kv.match_prefix(first), 11, [])
    first.num_computed_tokens = 11
    kv.cache_computed(first)
    second = Request("b", list(range(10)) + [77, 78], SamplingParams())
    copies = []
    match = kv.match_prefix(second)
    assert match.num_tokens == 10
    assert kv.allocate_with_prefix(second, match, 2, copies)
    assert second.block_table[:2] == first.block_table[:2]
    assert copies == [(first.block_table[2], second.block_table[2], 2)]
    assert second.num_computed_tokens == 10
    kv.check_invariants([first, second])


def test_eviction_order_survives_touches_locks_and_splits():
    pool, cache = make_cache(num_blocks=12)
    for tokens in ([1] * 8, [1] * 4 + [2] * 4, [3] * 8):
        blocks = pool.allocate(2)
        cache.insert(tokens, blocks)
        pool.free(blocks)
    cache.match_prefix([1] * 6)  # splits [1]*8 after 4 tokens (inside no block): the upper part is a new node
    held = cache.match_prefix([3] * 8).node
    cache.lock(held)
    scanned = copy.deepcopy(cache)
    assert (cache.evict(1), tree_of(cache)) == (evict_by_full_scan(scanned, 1), tree_of(scanned))
    cache.unlock(held)
    for step in range(500):  # each touch leaves a stale entry behind: the heap is rebuilt, never larger than that
        cache.match_prefix([[1] * 8, [1] * 4 + [2] * 4, [3] * 8][step % 3])
        assert len(cache._evictable) <= 2 * cache.num_nodes + 65
    cache.check_invariants()
    scanned = copy.deepcopy(cache)
    assert (cache.evict(12), tree_of(cache)) == (evict_by_full_scan(scanned, 12), tree_of(scanned))
    assert cache.num_nodes == 0
    cache.check_invariants()


def content(tokens, position):
    return hash(tuple(tokens[:position + 1]))


class CacheMachine(RuleBasedStateMachine):
    """Random admit / compute / decode / finish / evict sequences over a small pool."""

    @initialize()
    def setup(self):
        self.kv = KVCacheManager(num_blocks=20, block_size=BS, enable_prefix_caching=True)
        self.store: dict[int, int] = {}
        self.live: dict[str, Request] = {}
        self.next_id = 0

    def slot(self, request, position):
        return request.block_table[position // BS] * BS + position % BS

    def compute(self, request, num_new):
        for position in range(request.num_computed_tokens, request.num_computed_tokens + num_new):
            self.store[self.slot(request, position)] = content(request.all_token_ids, position)
        request.num_computed_tokens += num_new
        self.kv.cache_computed(request)

    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=24))
    def admit(self, data, tokens):
        request = Request(str(self.next_id), tokens, SamplingParams())
        self.next_id += 1
        match = self.kv.match_prefix(request)
        num_cached = match.num_tokens if match else 0
        num_new = data.draw(st.integers(1, request.num_tokens - num_cached))
        copies = []
        if not self.kv.allocate_with_prefix(request, match, num_new, copies):
            return
        for src, dst, count in copies:
            for offset in range(count):
                self.store[dst * BS + offset] = self.store[src * BS + offset]
        for position in range(num_cached):
            assert self.store[self.slot(request, position)] == content(tokens, position), "wrong cached K/V"
        self.live[request.request_id] = request
        self.compute(request, num_new)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def progress(self, data):
        request = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda r: r.request_id)))
        if request.num_computed_tokens == request.num_tokens:
            request.append_output_token(data.draw(st.integers(0, 2)))  # a decode step appends a token
        num_new = data.draw(st.integers(1, request.num_uncomputed_tokens))
        if self.kv.allocate_slots(request, num_new):
            self.compute(request, num_new)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        request = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda r: r.request_id)))
        self.kv.free(request)
        del self.live[request.request_id]

    @rule(num_blocks=st.integers(1, 20))
    def evict(self, num_blocks):
        cache = self.kv.radix_cache
        scanned = copy.deepcopy(cache)
        freed = evict_by_full_scan(scanned, num_blocks)
        assert (cache.evict(num_blocks), tree_of(cache)) == (freed, tree_of(scanned)), "not the full scan's eviction"

    @invariant()
    def consistent(self):
        self.kv.check_invariants(self.live.values())
        for request in self.live.values():
            for position in range(request.num_computed_tokens):
                assert self.store[self.slot(request, position)] == content(request.all_token_ids, position)
        for node in self.kv._locked_nodes.values():  # locked nodes are never evicted
            while node.parent is not None:
                assert node.parent.children.get(node.token_ids[0]) is node
                node = node.parent

    def teardown(self):
        for request in list(self.live.values()):
            self.kv.free(request)
        self.kv.reset_prefix_cache()
        assert self.kv.num_free_blocks == self.kv.num_blocks, "leaked blocks after releasing everything"


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_bench_evict_compares_the_heap_with_the_full_scan_on_the_same_tree(capsys):
    bench_evict([600, 2000], tokens_per_request=96, num_evictions=20, seed=0)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 600 ") or
            line.startswith("| 2000 ")]
    assert len(rows) == 2 and all(row.endswith("| yes |") for row in rows), rows


@pytest.mark.parametrize(("sizes", "tokens", "evictions", "flag"), [
    ([0], 96, 1, "--num-blocks"), ([], 96, 1, "--num-blocks"), ([10**9], 96, 1, "--num-blocks"),
    ([600], 10, 1, "--tokens-per-request"), ([600], 10**9, 1, "--tokens-per-request"),
    ([600], 96, 0, "--num-evictions"),
])
def test_bench_evict_refuses_options_that_would_hang_or_exhaust_memory(sizes, tokens, evictions, flag):
    with pytest.raises(ValueError, match=flag):
        bench_evict(sizes, tokens_per_request=tokens, num_evictions=evictions, seed=0)
