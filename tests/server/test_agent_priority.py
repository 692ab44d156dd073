"""Over HTTP: when the KV cache fills up, the request in an agent's tool loop keeps running and the plain one is
preempted, although the plain one arrived first (fcfs would otherwise preempt the latest arrival)."""

from __future__ import annotations

import re
import threading
import time

import pytest

from radixlm.trace.replay import Trace
from server.inprocess import InProcessApp

RUNNING_ONE = re.compile(r"^radixlm:num_requests_running\{[^}]*\} 1\.0$", re.MULTILINE)
TOOL_LOOP = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                 "name": "f", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


@pytest.mark.parametrize(("agent_loop", "victim"), [(None, "plain"), (True, "plain"), (False, "agent")])
def test_full_kv_cache_preempts_the_plain_request_first(tiny_model_dir, tmp_path, agent_loop, victim):
    """`agent_loop` unset: inferred from the tool message; false: opts out, and fcfs preempts the latest arrival."""
    trace_path = tmp_path / "trace.jsonl"
    # 100 blocks of 4 tokens: each request alone fits (prompt + 300 tokens), both together do not.
    app = InProcessApp(tiny_model_dir("llama"), {"num_kv_blocks": 100, "trace": str(trace_path)})
    try:
        def send(messages: list[dict], who: str, **fields) -> None:
            body = {"messages": messages, "max_tokens": 300, "ignore_eos": True, "metadata": {"who": who}, **fields}
            assert app.post("/v1/chat/completions", body).status_code == 200

        plain = threading.Thread(target=send, args=([{"role": "user", "content": "hello"}], "plain"))
        plain.start()
        deadline = time.monotonic() + 30
        while not RUNNING_ONE.search(app.request("GET", "/metrics").text):  # the plain request is running first
            assert time.monotonic() < deadline
            time.sleep(0.01)
        send(TOOL_LOOP, "agent", **({} if agent_loop is None else {"agent_loop": agent_loop}))
        plain.join()
    finally:
        app.close()
    trace = Trace.load(trace_path)
    who = {event["request_id"]: event["metadata"]["who"] for event in trace.of("arrival")}
    preempted = [who[seq_id] for step in trace.of("step") for seq_id in step["preempted"]]
    assert preempted and set(preempted) == {victim}
