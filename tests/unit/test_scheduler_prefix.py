"""Cache-aware scheduling with a fake model: prefix hits at admission, lpm ordering, in-batch de-duplication."""

from radixlm.config import SchedulerConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.request import Request
from radixlm.sampling_params import SamplingParams
from unit.fake_engine import chunk_sizes, step


def make(policy="fcfs", num_blocks=64, budget=2048, fallback=128):
    config = SchedulerConfig(schedule_policy=policy, max_num_batched_tokens=budget, lpm_fallback_queue_len=fallback)
    return Scheduler(config, KVCacheManager(num_blocks, 4, enable_prefix_caching=True), max_model_len=512)


def request(request_id, token_ids, order=0, max_tokens=2):
    return Request(request_id, token_ids, SamplingParams(max_tokens=max_tokens), arrival_order=order)


def test_second_request_starts_from_the_cached_prefix_with_a_partial_block_copy():
    scheduler = make()
    prefix = list(range(100, 150))  # 50 tokens: 12 full blocks + 2 tokens
    a = request("a", [*prefix, 1, 2, 3], max_tokens=5)
    scheduler.add_request(a)
    step(scheduler)
    scheduler.add_request(request("b", [*prefix, 7, 8], order=1))
    output = step(scheduler)
    assert chunk_sizes(output)["b"] == 2  # only the two new tokens
    b = scheduler.requests["b"]
    assert b.num_cached_tokens == 50
    assert b.block_table[:12] == a.block_table[:12]
    assert output.block_copies == [(a.block_table[12], b.block_table[12], 2)]


def test_in_batch_duplicate_prefix_waits_one_step_then_hits():
    scheduler = make()
    prefix = list(range(100, 180))
    scheduler.add_request(request("a", [*prefix, 1]))
    scheduler.add_request(request("b", [*prefix, 2], order=1))
    scheduler.add_request(request("c", [5, 6, 7], order=2))  # unrelated: not held back
    first = step(scheduler)
    assert set(chunk_sizes(first)) == {"a", "c"}
    second = step(scheduler)
    assert chunk_sizes(second)["b"] == 1 and scheduler.requests["b"].num_cached_tokens == 80


def test_lpm_orders_waiting_by_cached_prefix_and_falls_back_to_fcfs():
    for fallback, expected in ((128, ["hit", "miss"]), (1, ["miss", "hit"])):
        scheduler = make(policy="lpm", budget=64, fallback=fallback)
        prefix = list(range(100, 160))
        scheduler.add_request(request("warm", prefix))
        step(scheduler)
        step(scheduler)
        scheduler.add_request(request("miss", list(range(300, 360)), order=1))
        scheduler.add_request(request("hit", [*prefix, 1, 2], order=2))
        output = step(scheduler)
        assert [c.request_id for c in output.chunks][:2] == expected


def test_eviction_before_preemption():
    scheduler = make(num_blocks=12)
    scheduler.add_request(request("old", list(range(100, 140)), max_tokens=1))
    step(scheduler)
    assert scheduler.kv_cache_manager.block_pool.num_used_blocks == 10  # finished, still cached in the tree
    scheduler.add_request(request("new", list(range(200, 240)), order=1, max_tokens=3))
    for _ in range(3):
        output = step(scheduler)
        assert not output.preempted_request_ids
    assert scheduler.kv_cache_manager.num_evicted_blocks > 0
