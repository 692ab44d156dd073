"""The step contract on the scheduler side, with a fake model: deltas to the worker (new requests once, new blocks,
finished and preempted ids), draft tokens verified in a chunk, rejected ones trimmed and never cached."""

import pickle

from radixlm.config import SchedulerConfig
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.request import Request
from radixlm.sampling_params import SamplingParams
from unit.fake_engine import runner_output, step


def make(num_blocks=64, max_model_len=512, **config):
    return Scheduler(SchedulerConfig(**config), KVCacheManager(num_blocks, 4, enable_prefix_caching=True),
                     max_model_len)


def request(request_id, prompt_len=6, max_tokens=20, **params):
    return Request(request_id, list(range(10, 10 + prompt_len)), SamplingParams(max_tokens=max_tokens, **params))


def test_a_request_is_sent_whole_once_then_as_deltas():
    scheduler = make()
    scheduler.add_request(request("a", prompt_len=6, max_tokens=3, temperature=0.5, seed=7))
    first = step(scheduler)
    (new,) = first.new_requests
    assert (new.request_id, new.token_ids, new.num_prompt_tokens) == ("a", list(range(10, 16)), 6)
    assert SamplingParams.from_dict(new.sampling_params) == scheduler.requests["a"].sampling_params
    assert first.chunks[0].new_block_ids == scheduler.requests["a"].block_table  # the whole table, once
    second = step(scheduler)  # position 6: still in block 1
    assert second.new_requests == [] and second.chunks[0].new_block_ids == []
    assert second.chunks[0].token_ids == [7]  # only the token the step computes
    third = step(scheduler)  # position 7, then the request ends (max_tokens=3)
    assert third.chunks[0].new_block_ids == []
    scheduler.add_request(request("b"))
    fourth = step(scheduler)
    assert fourth.finished_request_ids == ["a"] and [n.request_id for n in fourth.new_requests] == ["b"]


def test_a_preempted_request_is_sent_whole_again_when_it_resumes():
    scheduler = make(num_blocks=5)
    scheduler.add_request(request("a", prompt_len=8, max_tokens=12))
    step(scheduler)
    scheduler.add_request(request("b", prompt_len=8, max_tokens=12))
    preempted_in = None
    for index in range(40):
        output = step(scheduler)
        if output.preempted_request_ids and preempted_in is None:
            preempted_in = index
            victim = output.preempted_request_ids[0]
        if preempted_in is not None and any(n.request_id == victim for n in output.new_requests):
            resumed = next(n for n in output.new_requests if n.request_id == victim)
            assert len(resumed.token_ids) > 8  # its generated tokens travel too
            chunk = next(c for c in output.chunks if c.request_id == victim)
            assert chunk.new_block_ids == scheduler.requests[victim].block_table
            return
    raise AssertionError("no preemption and resume happened")


def test_drafts_are_scheduled_after_the_last_token_and_rejected_ones_are_trimmed_and_never_cached():
    scheduler = make()
    a = request("a", prompt_len=6, max_tokens=20)
    scheduler.add_request(a)
    step(scheduler, token_id=7)  # a: prompt computed, first token 7
    a.draft_token_ids = [8, 9, 1, 2, 3]
    output = scheduler.schedule()
    (chunk,) = output.chunks
    assert chunk.token_ids == [7, 8, 9, 1, 2, 3] and chunk.num_sampled == 6 and chunk.start_position == 6
    assert len(a.block_table) == 3  # positions 0..11
    # The worker accepted drafts 8 and 9 and then sampled 5 where the draft said 1.
    updated = scheduler.update_from_output(output, runner_output(output, {"a": [8, 9, 5]}))
    assert [(u.request_id, len(u.new_token_ids)) for u in updated] == [("a", 3)] and a.output_token_ids == [7, 8, 9, 5]
    assert a.num_computed_tokens == 9 and a.num_tokens == 10  # 7, 8, 9 computed; 5 is next
    assert len(a.block_table) == 3 and a.draft_token_ids == []
    tree = scheduler.kv_cache_manager.radix_cache
    assert tree.match_length([*range(10, 16), 7, 8, 9, 1, 2]) == 9  # the rejected 1, 2 never reach the tree
    scheduler.check_invariants()
    a.draft_token_ids = [4] * 12  # blocks 3..5 taken, then freed when all but one are rejected
    output = scheduler.schedule()
    assert output.chunks[0].num_tokens == 13 and len(a.block_table) == 6
    scheduler.update_from_output(output, runner_output(output, {"a": [4, 6]}))
    assert a.num_computed_tokens == 11 and len(a.block_table) == 3  # 12 tokens: 3 blocks
    scheduler.check_invariants()
    following = scheduler.schedule()
    assert following.trimmed_block_tables == {"a": 3}  # the worker cuts its copy of the table too
    assert following.chunks[0].new_block_ids == [] and following.chunks[0].token_ids == [6]


def test_drafts_never_pass_max_tokens_or_the_context():
    scheduler = make(max_model_len=12)
    a = request("a", prompt_len=6, max_tokens=4)
    scheduler.add_request(a)
    step(scheduler)
    a.draft_token_ids = [1, 2, 3, 4, 5]
    output = scheduler.schedule()
    assert output.chunks[0].num_sampled == 3  # 1 token out, 3 more at most: 2 drafts + 1
    scheduler.update_from_output(output, runner_output(output, {"a": [1, 2, 9]}))
    assert a.is_finished and a.output_token_ids[-1] == 9 and a.num_output_tokens == 4


def test_a_token_stop_inside_a_verified_run_drops_the_tokens_after_it():
    scheduler = make()
    a = Request("a", [10, 11, 12], SamplingParams(max_tokens=20), eos_token_ids=frozenset({2}))
    scheduler.add_request(a)
    step(scheduler)
    a.draft_token_ids = [5, 2, 6]
    output = scheduler.schedule()
    updates = scheduler.update_from_output(output, runner_output(output, {"a": [5, 2, 6, 8]}))
    assert [(u.request_id, len(u.new_token_ids)) for u in updates] == [("a", 2)]
    assert a.is_finished and a.output_token_ids == [7, 5, 2]
    scheduler.check_invariants()


def test_the_step_input_pickles_and_round_trips():
    scheduler = make()
    for i in range(3):
        scheduler.add_request(request(f"r{i}", logit_bias={5: 1.5}, stop=["x"]))
    output = step(scheduler)
    copy = pickle.loads(pickle.dumps(output))
    assert copy == output
    assert [SamplingParams.from_dict(n.sampling_params) for n in copy.new_requests] == \
        [scheduler.requests[f"r{i}"].sampling_params for i in range(3)]
