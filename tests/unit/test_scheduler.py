import pytest

from radixlm.core.scheduler import QueueFullError
from radixlm.request import Request, RequestStatus
from radixlm.sampling_params import SamplingParams
from unit.fake_engine import EOS, chunk_sizes, make_request, make_scheduler, step


def run_to_completion(scheduler, max_steps=1000):
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return
        step(scheduler)
    raise AssertionError("did not finish")


def test_budget_filling_decodes_first_then_prefill_chunks():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    scheduler.add_request(make_request("a", 3, order=0))
    scheduler.add_request(make_request("b", 3, order=1))
    assert chunk_sizes(step(scheduler)) == {"a": 3, "b": 3}
    scheduler.add_request(make_request("c", 20, order=2))
    output = step(scheduler)
    assert [c.request_id for c in output.chunks] == ["a", "b", "c"]
    assert chunk_sizes(output) == {"a": 1, "b": 1, "c": 8}
    assert output.num_scheduled_tokens == 10
    output = step(scheduler)
    assert chunk_sizes(output) == {"a": 1, "b": 1, "c": 8}
    assert [c.samples for c in output.chunks] == [True, True, False]
    output = step(scheduler)  # c's last 4 prompt tokens: it samples now
    assert chunk_sizes(output) == {"a": 1, "b": 1, "c": 4}
    assert output.chunks[-1].samples


def test_chunk_positions_and_block_tables_cover_the_context():
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=5)
    scheduler.add_request(make_request("a", 12))
    starts = []
    for _ in range(3):
        output = step(scheduler)
        chunk = output.chunks[0]
        starts.append(chunk.start_position)
        assert len(scheduler.requests["a"].block_table) * 4 >= chunk.context_len
        assert chunk.token_ids == list(range(10 + chunk.start_position, 10 + chunk.context_len))
    assert starts == [0, 5, 10]


def test_max_num_seqs_limits_running_requests():
    scheduler = make_scheduler(max_num_seqs=2)
    for i in range(3):
        scheduler.add_request(make_request(str(i), 2, order=i))
    assert set(chunk_sizes(step(scheduler))) == {"0", "1"}
    assert scheduler.num_waiting == 1


def test_preemption_picks_lowest_priority_then_latest_arrival():
    # 6 blocks of 4 tokens; three 8-token prompts take 2 blocks each, so the first decode of each needs a 3rd.
    scheduler = make_scheduler(num_blocks=6, block_size=4, schedule_policy="priority")
    scheduler.add_request(make_request("low-late", 8, max_tokens=10, priority=5, order=2))
    scheduler.add_request(make_request("high", 8, max_tokens=10, priority=0, order=0))
    scheduler.add_request(make_request("low-early", 8, max_tokens=10, priority=5, order=1))
    step(scheduler)
    output = step(scheduler)  # each needs a new block for position 8: only the lowest-priority latest one yields
    assert output.preempted_request_ids == ["low-late"]
    assert scheduler.requests["low-late"].status is RequestStatus.WAITING
    assert scheduler.requests["low-late"].block_table == []
    assert set(chunk_sizes(output)) == {"high", "low-early"}


def test_fcfs_preempts_latest_arrival_and_puts_it_first_in_line():
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    scheduler.add_request(make_request("a", 8, max_tokens=8, order=0))
    scheduler.add_request(make_request("b", 8, max_tokens=8, order=1))
    step(scheduler)
    scheduler.add_request(make_request("c", 3, order=2))
    output = step(scheduler)
    assert output.preempted_request_ids == ["b"]
    assert [r.request_id for r in scheduler.waiting] == ["b", "c"]


def test_preempted_request_resumes_by_recomputing_prompt_and_generated_tokens():
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    scheduler.add_request(make_request("a", 8, max_tokens=8, order=0))
    scheduler.add_request(make_request("b", 8, max_tokens=8, order=1))
    step(scheduler)
    step(scheduler)  # b preempted with one generated token
    b = scheduler.requests["b"]
    assert b.num_output_tokens == 1 and b.num_computed_tokens == 0
    resumed = None
    while resumed is None:
        resumed = next((c for c in step(scheduler).chunks if c.request_id == "b"), None)
    assert resumed.start_position == 0 and resumed.num_tokens == 9  # 8 prompt + 1 generated, recomputed
    assert resumed.token_ids[-1] == 7 and resumed.samples
    run_to_completion(scheduler)
    assert scheduler.kv_cache_manager.num_free_blocks == 4


def test_abort_in_every_state_frees_blocks():
    scheduler = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=6)
    scheduler.add_request(make_request("decoding", 3, max_tokens=50, order=0))
    scheduler.add_request(make_request("prefilling", 20, order=1))
    scheduler.add_request(make_request("waiting", 3, order=2))
    step(scheduler)
    step(scheduler)
    states = {rid: r.status for rid, r in scheduler.requests.items()}
    assert states["prefilling"] is RequestStatus.RUNNING and scheduler.requests["prefilling"].num_computed_tokens < 20
    assert states["waiting"] is RequestStatus.WAITING
    for request_id in ["prefilling", "waiting", "decoding"]:
        request = scheduler.requests[request_id]
        assert scheduler.abort(request_id)
        assert request.status is RequestStatus.FINISHED_ABORTED and request.block_table == []
        scheduler.check_invariants()
    assert scheduler.kv_cache_manager.num_free_blocks == 16
    assert not scheduler.abort("decoding")  # already finished: no-op
    assert not scheduler.abort("never-existed")


def test_abort_of_a_preempted_request():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    scheduler.add_request(make_request("a", 8, max_tokens=8, order=0))
    scheduler.add_request(make_request("b", 8, max_tokens=8, order=1))
    step(scheduler)
    step(scheduler)
    assert scheduler.requests["b"].num_preemptions == 1
    assert scheduler.abort("b")
    run_to_completion(scheduler)
    assert scheduler.kv_cache_manager.num_free_blocks == 4


def test_never_fits_is_rejected_at_admission():
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=16)
    with pytest.raises(ValueError, match=r"prompt has 16 tokens but the context is 16 tokens"):
        scheduler.add_request(make_request("big", 16))
    scheduler.add_request(make_request("ok", 15, max_tokens=100))
    run_to_completion(scheduler)  # the lone request stops at the context length instead of looping


def test_length_limits():
    scheduler = make_scheduler(max_model_len=12)
    a = make_request("a", 10, max_tokens=100)
    b = make_request("b", 3, max_tokens=2, order=1)
    scheduler.add_request(a)
    scheduler.add_request(b)
    run_to_completion(scheduler)
    assert a.status is RequestStatus.FINISHED_LENGTH and a.num_tokens == 12
    assert b.status is RequestStatus.FINISHED_LENGTH and b.num_output_tokens == 2


def test_token_stops_eos_stop_token_ids_and_min_tokens():
    scheduler = make_scheduler()
    eos = make_request("eos", 3, max_tokens=10)
    ignore = make_request("ignore", 3, max_tokens=3, ignore_eos=True, order=1)
    stop_id = make_request("stop_id", 3, max_tokens=10, stop_token_ids=[EOS + 5], order=2)
    late = make_request("late", 3, max_tokens=10, min_tokens=3, order=3)
    for request in (eos, ignore, late):
        scheduler.add_request(request)
    for _ in range(3):
        step(scheduler, token_id=EOS)
    assert eos.status is RequestStatus.FINISHED_STOPPED and eos.num_output_tokens == 1 and eos.stop_reason is None
    assert ignore.status is RequestStatus.FINISHED_LENGTH and ignore.num_output_tokens == 3
    assert late.status is RequestStatus.FINISHED_STOPPED and late.num_output_tokens == 3
    scheduler.add_request(stop_id)
    step(scheduler, token_id=EOS + 5)
    assert stop_id.status is RequestStatus.FINISHED_STOPPED and stop_id.stop_reason == EOS + 5


def test_queue_limit_and_duplicate_ids():
    scheduler = make_scheduler(max_queued_requests=1)
    scheduler.add_request(make_request("a", 3))
    with pytest.raises(QueueFullError, match="max_queued_requests=1"):
        scheduler.add_request(make_request("b", 3))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(make_request("a", 3))


def test_priority_policy_orders_waiting_requests():
    scheduler = make_scheduler(max_num_seqs=1, schedule_policy="priority")
    scheduler.add_request(make_request("late-important", 3, priority=-1, order=1))
    scheduler.add_request(make_request("normal", 3, priority=0, order=0))
    scheduler.add_request(make_request("early-important", 3, priority=-1, order=0 - 1))
    assert [r.request_id for r in scheduler.waiting] == ["early-important", "late-important", "normal"]


def test_priority_policy_lets_an_urgent_request_preempt_a_lower_priority_one():
    scheduler = make_scheduler(num_blocks=8, block_size=4, max_model_len=32, schedule_policy="priority")
    low = make_request("low", 28, max_tokens=4, priority=5, order=0)
    scheduler.add_request(low)
    step(scheduler)  # 7 blocks; its first decode takes the 8th
    urgent = make_request("urgent", 8, max_tokens=2, priority=0, order=1)
    same = make_request("same", 8, max_tokens=2, priority=5, order=2)  # equal priority never preempts
    scheduler.add_request(urgent)
    output = step(scheduler)
    assert output.preempted_request_ids == ["low"] and chunk_sizes(output) == {"urgent": 8}
    scheduler.add_request(same)
    run_to_completion(scheduler)
    assert low.num_preemptions == 1 and same.num_preemptions == 0
    assert low.status is RequestStatus.FINISHED_LENGTH and low.num_output_tokens == 4


def test_priority_preemption_when_max_num_seqs_is_reached():
    scheduler = make_scheduler(max_num_seqs=1, schedule_policy="priority")
    scheduler.add_request(make_request("low", 3, max_tokens=10, priority=1, order=0))
    step(scheduler)
    scheduler.add_request(make_request("high", 3, priority=0, order=1))
    output = step(scheduler)
    assert output.preempted_request_ids == ["low"] and set(chunk_sizes(output)) == {"high"}


def test_min_tokens_never_carry_a_request_past_the_context():
    scheduler = make_scheduler(max_model_len=20)
    with pytest.raises(ValueError, match=r"min_tokens \(11\) plus the prompt \(10 tokens\)"):
        scheduler.add_request(make_request("too-many", 10, max_tokens=None, min_tokens=11))
    request = make_request("fits", 10, max_tokens=None, min_tokens=10)
    scheduler.add_request(request)
    run_to_completion(scheduler)
    assert request.status is RequestStatus.FINISHED_LENGTH and request.num_tokens == 20


def test_a_lone_request_fits_even_when_its_cached_path_pins_branch_copies():
    """A branch inside a block leaves a copy of that block on both sides; a lone request whose matched path pins
    both must still run (it starts from nothing and eviction frees the tree) instead of waiting forever."""
    from radixlm.config import SchedulerConfig
    from radixlm.core.kv_cache_manager import KVCacheManager
    from radixlm.core.scheduler import Scheduler

    scheduler = Scheduler(SchedulerConfig(), KVCacheManager(4, 4, enable_prefix_caching=True), max_model_len=16)
    first = make_request("first", 10, max_tokens=1)
    scheduler.add_request(first)
    run_to_completion(scheduler)
    second = Request("second", [*first.prompt_token_ids[:6], 100, 101, 102], SamplingParams(max_tokens=6),
                     arrival_order=1)
    scheduler.add_request(second)
    run_to_completion(scheduler, max_steps=50)
    assert second.status is RequestStatus.FINISHED_LENGTH and second.num_tokens == 15


def test_a_request_with_n_sequences_waits_for_n_seats():
    """Sequence 0 forks into n in the step of its first token, so it is admitted only when all n fit."""
    scheduler = make_scheduler(max_num_seqs=4)
    scheduler.add_request(make_request("one", 3, max_tokens=2, order=0))
    step(scheduler)
    scheduler.add_request(make_request("four", 3, order=1, n=4))
    scheduler.add_request(make_request("behind", 3, order=2))  # first come, first served: it waits its turn
    assert set(chunk_sizes(step(scheduler))) == {"one"}
    assert set(chunk_sizes(step(scheduler))) == {"four"}  # "one" finished; "four" takes all four seats
    assert set(chunk_sizes(step(scheduler))) == {"four", "behind"}  # it has its token: one seat from now on


def test_a_request_with_more_sequences_than_seats_runs_alone():
    scheduler = make_scheduler(max_num_seqs=2)
    scheduler.add_request(make_request("six", 3, order=0, n=6))
    scheduler.add_request(make_request("next", 3, order=1))
    assert set(chunk_sizes(step(scheduler))) == {"six"}
