"""Requests inside an agent's tool loop are the last to be preempted: the server gives them the top priority tier,
and the scheduler's victim order (lowest priority, then latest arrival) honours it under every policy."""

import pytest

from radixlm.server.request_bodies import AGENT_LOOP_PRIORITY, ChatCompletionRequest
from unit.fake_engine import make_request, make_scheduler, step

USER = {"role": "user", "content": "weather?"}
TOOL_RESULT = [USER, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


@pytest.mark.parametrize("policy", ["fcfs", "priority", "lpm"])
def test_full_kv_cache_preempts_the_plain_request_not_the_agent_loop(policy):
    # 4 blocks of 4 tokens: two 8-token prompts fill them; the next decode of either needs a fifth block.
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64, schedule_policy=policy)
    scheduler.add_request(make_request("plain", 8, max_tokens=8, order=0))
    scheduler.add_request(make_request("agent", 8, max_tokens=8, order=1, priority=AGENT_LOOP_PRIORITY))
    step(scheduler)
    output = step(scheduler)
    assert output.preempted_request_ids == ["plain"]  # without the tier, the latest arrival ("agent") would go


def test_a_tool_result_marks_the_request_as_in_the_loop():
    assert ChatCompletionRequest(messages=TOOL_RESULT).engine_priority() == AGENT_LOOP_PRIORITY
    assert ChatCompletionRequest(messages=[USER]).engine_priority() == 0
    assert ChatCompletionRequest(messages=[USER], agent_loop=True).engine_priority() == AGENT_LOOP_PRIORITY
    assert ChatCompletionRequest(messages=TOOL_RESULT, agent_loop=False, priority=3).engine_priority() == 3


def test_client_priorities_stay_above_the_agent_tier():
    with pytest.raises(ValueError, match="priority"):
        ChatCompletionRequest(messages=[USER], priority=AGENT_LOOP_PRIORITY)
