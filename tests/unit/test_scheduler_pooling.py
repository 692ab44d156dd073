"""Pooling (embedding) requests in the scheduler, with a fake model: they are scheduled like any prefill (budget,
chunks, priorities, preemption, abort), never sample, and finish in the step that computes their last prompt token;
mean pooling skips the prefix cache, last pooling uses it."""

import pytest

from radixlm.config import SchedulerConfig, SpeculativeConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.pooling_params import POOLING_SAMPLING_PARAMS, PoolingParams
from radixlm.request import Request, RequestStatus
from radixlm.speculative.drafter import NgramDrafter
from unit.fake_engine import chunk_sizes, make_request, make_scheduler, runner_output, step


def pooling_request(request_id: str, token_ids: list[int], pooling_type: str = "last", order: int = 0,
                    priority: int = 0) -> Request:
    return Request(request_id, token_ids, POOLING_SAMPLING_PARAMS, arrival_order=order, priority=priority,
                   pooling_params=PoolingParams(pooling_type))


def cached_scheduler(budget: int = 2048, num_blocks: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget), KVCacheManager(num_blocks, 4, True), 256)


def test_a_pooling_request_finishes_in_the_step_that_computes_its_prompt_and_samples_nothing():
    scheduler = make_scheduler()
    scheduler.add_request(pooling_request("e", list(range(10, 16))))
    output = step(scheduler)
    (chunk,) = output.chunks
    assert (chunk.num_tokens, chunk.num_sampled, chunk.pools, chunk.samples) == (6, 0, True, False)
    assert output.sampling_request_ids == [] and output.pooling_request_ids == ["e"]
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.num_free_blocks == scheduler.kv_cache_manager.num_blocks
    assert step(scheduler).is_empty and scheduler.schedule().finished_request_ids == ["e"]  # the worker forgets it


def test_update_reports_the_finished_pooling_request_with_no_token():
    scheduler = make_scheduler()
    request = pooling_request("e", [10, 11, 12])
    scheduler.add_request(request)
    output = scheduler.schedule()
    updates = scheduler.update_from_output(output, runner_output(output, {}))
    assert [(u.request_id, u.new_token_ids, u.status, u.embedding) for u in updates] == [
        ("e", [], RequestStatus.FINISHED_STOPPED, [1.0])]
    assert request.status is RequestStatus.FINISHED_STOPPED and request.status.finish_reason == "stop"
    assert request.num_output_tokens == 0 and request.num_computed_tokens == 3


def test_a_long_prompt_is_chunked_by_the_budget_and_pools_only_with_its_last_chunk():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(pooling_request("e", list(range(10, 20)), "mean"))
    chunks = [step(scheduler).chunks[0] for _ in range(3)]
    assert [(c.start_position, c.num_tokens, c.pools, c.num_sampled) for c in chunks] == [
        (0, 4, False, 0), (4, 4, False, 0), (8, 2, True, 0)]
    assert not scheduler.has_unfinished_requests()


def test_pooling_and_generation_share_a_step_and_the_budget():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    scheduler.add_request(make_request("g", 3, max_tokens=3, order=0))
    scheduler.add_request(pooling_request("e", list(range(10, 22)), order=1))
    first = step(scheduler)
    assert chunk_sizes(first) == {"g": 3, "e": 5} and first.sampling_request_ids == ["g"]
    second = step(scheduler)
    assert chunk_sizes(second) == {"g": 1, "e": 7} and second.pooling_request_ids == ["e"]
    assert second.sampling_request_ids == ["g"]
    assert list(scheduler.requests) == ["g"] and scheduler.requests["g"].output_token_ids == [7, 7]


def test_mean_pooling_skips_the_prefix_cache_and_last_pooling_uses_it():
    scheduler = cached_scheduler()
    prefix = list(range(100, 140))
    scheduler.add_request(pooling_request("warm", [*prefix, 1]))
    step(scheduler)  # its 41 tokens are in the tree now
    scheduler.add_request(pooling_request("mean", [*prefix, 2], "mean", order=1))
    scheduler.add_request(pooling_request("last", [*prefix, 3], "last", order=2))
    output = step(scheduler)
    chunks = {c.request_id: c for c in output.chunks}
    assert (chunks["mean"].start_position, chunks["mean"].num_tokens) == (0, 41)  # every position computed
    assert chunks["last"].start_position == 40 and chunks["last"].num_tokens == 1  # only its own last token
    assert output.pooling_request_ids == ["mean", "last"]
    assert scheduler.kv_cache_manager.stats.num_hit_tokens == 40


def test_mean_pooling_with_a_whole_prompt_cached_still_computes_it():
    scheduler = cached_scheduler()
    prompt = list(range(100, 120))
    scheduler.add_request(pooling_request("first", prompt, "last"))
    step(scheduler)
    scheduler.add_request(pooling_request("again", prompt, "mean", order=1))
    chunk = step(scheduler).chunks[0]
    assert (chunk.start_position, chunk.num_tokens, chunk.pools) == (0, 20, True)


def test_lpm_orders_mean_pooling_requests_as_if_nothing_were_cached():
    scheduler = Scheduler(SchedulerConfig(schedule_policy="lpm", max_num_batched_tokens=64),
                          KVCacheManager(64, 4, True), 256)
    prefix = list(range(100, 160))
    scheduler.add_request(pooling_request("warm", prefix))
    step(scheduler)
    scheduler.add_request(pooling_request("mean-hit", [*prefix, 1], "mean", order=1))
    scheduler.add_request(pooling_request("last-hit", [*prefix, 2], "last", order=2))
    assert [c.request_id for c in step(scheduler).chunks] == ["last-hit", "mean-hit"]  # mean's hit is no use


def test_aborting_a_pooling_request_mid_prefill_frees_it():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(pooling_request("e", list(range(10, 22))))
    step(scheduler)
    assert scheduler.requests["e"].num_computed_tokens == 4
    assert scheduler.abort("e")
    scheduler.check_invariants()
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.num_free_blocks == scheduler.kv_cache_manager.num_blocks
    output = scheduler.schedule()
    assert output.is_empty and output.finished_request_ids == ["e"]


def test_a_preempted_pooling_request_recomputes_its_prompt_from_the_start():
    # 5 blocks of 4 tokens: g's decodes outgrow what is left after e's first chunk, and e (later) is the victim.
    scheduler = make_scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=9)
    scheduler.add_request(make_request("g", 8, max_tokens=8, order=0))
    scheduler.add_request(pooling_request("e", list(range(10, 22)), "mean", order=1))
    outputs = [step(scheduler) for _ in range(40) if scheduler.has_unfinished_requests()]
    preempting = [i for i, o in enumerate(outputs) if o.preempted_request_ids]
    assert preempting and all(outputs[i].preempted_request_ids == ["e"] for i in preempting)
    resumed = [c for o in outputs[preempting[-1] + 1:] for c in o.chunks if c.request_id == "e"]
    assert resumed[0].start_position == 0 and resumed[-1].pools
    assert sum(c.num_tokens for c in resumed) == 12
    assert not scheduler.has_unfinished_requests()


def test_priority_applies_to_pooling_requests():
    scheduler = make_scheduler(max_num_seqs=1, schedule_policy="priority")
    scheduler.add_request(pooling_request("later", [10, 11], priority=5, order=0))
    scheduler.add_request(pooling_request("urgent", [12, 13], priority=0, order=1))
    assert [c.request_id for c in step(scheduler).chunks] == ["urgent"]
    assert [c.request_id for c in step(scheduler).chunks] == ["later"]


def test_a_pooling_prompt_may_fill_the_context_a_generation_prompt_may_not():
    scheduler = make_scheduler(max_model_len=16)
    scheduler.add_request(pooling_request("full", list(range(10, 26))))
    with pytest.raises(ValueError, match="context is 16 tokens"):
        scheduler.add_request(pooling_request("over", list(range(10, 27))))
    with pytest.raises(ValueError, match="leaving no room to generate"):
        scheduler.add_request(make_request("gen", 16))
    assert step(scheduler).pooling_request_ids == ["full"]


def test_pooling_requests_get_no_draft_tokens():
    scheduler = make_scheduler(max_num_batched_tokens=3)
    repeating = [5, 6, 7, 5, 6, 7, 5]
    request = pooling_request("e", repeating)
    scheduler.add_request(request)
    step(scheduler)
    step(scheduler)  # 6 of 7 computed: one left, where a generation request would draft
    drafter = NgramDrafter(SpeculativeConfig(num_speculative_tokens=3))
    drafter.propose(scheduler.running)
    assert request.num_uncomputed_tokens == 1 and request.draft_token_ids == []
    request.draft_token_ids = [6, 7]  # even if someone set some, the scheduler sends none
    chunk = step(scheduler).chunks[0]
    assert chunk.token_ids == [5] and chunk.num_sampled == 0 and chunk.pools


def test_pooling_params_are_validated():
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        PoolingParams("max")
    assert PoolingParams().resolved("mean") == PoolingParams("mean")
    assert PoolingParams("last").resolved("mean") == PoolingParams("last")
    assert PoolingParams("mean").needs_every_position and not PoolingParams("last").needs_every_position
