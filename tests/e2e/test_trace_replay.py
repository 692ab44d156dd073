"""--trace writes every arrival, step and finish; replaying the trace through a fresh scheduler (no model) schedules
exactly the recorded chunks, through chunked prefill, prefix hits, preemption, n > 1 forks, aborts and stops."""

import json

import pytest

from e2e.engine_runs import drain
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams
from radixlm.trace.replay import Trace, replay

SHARED = list(range(20, 52))  # 32 tokens that several prompts start with: prefix hits


@pytest.fixture(scope="module", params=[None, '{"method": "ngram", "prompt_lookup_min": 1}'],
                ids=["plain", "speculative"])
def trace_path(tiny_model_dir, tmp_path_factory, request):
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    engine = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=40, block_size=4,
                          max_num_batched_tokens=24, trace=str(path),  # small: chunking and preemption
                          speculative_config=request.param)
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for index in range(6):
        engine.add_request(f"r{index}", SHARED + list(range(60 + index, 70 + 2 * index)), greedy,
                           metadata={"user": str(index)})
    engine.add_request("forked", list(range(100, 112)), SamplingParams(n=3, seed=1, max_tokens=8, ignore_eos=True))
    engine.add_request("stopped", list(range(120, 130)), SamplingParams(max_tokens=30, stop_token_ids=[5, 6, 7, 8],
                                                                         seed=3))
    engine.add_request("aborted", list(range(140, 150)), greedy)
    for _ in range(3):
        engine.step()
    engine.abort_request("aborted")
    engine.add_request("late", SHARED + [9, 9, 9], greedy)
    drain(engine)
    assert engine.scheduler.num_preemptions > 0
    assert request.param is None or engine.drafter.stats.num_drafts > 0  # drafts were verified (and trimmed)
    return path


def test_the_trace_holds_every_event(trace_path):
    trace = Trace.load(trace_path)
    assert trace.config["num_blocks"] == 40 and trace.config["scheduler"]["max_num_batched_tokens"] == 24
    arrivals = {event["request_id"]: event for event in trace.of("arrival")}
    assert len(arrivals) == 10 and arrivals["r0"]["metadata"] == {"user": "0"}
    assert arrivals["forked"]["params"] == {"n": 3, "seed": 1, "max_tokens": 8, "ignore_eos": True}
    assert len(arrivals["r0"]["prompt_hash"]) == 16
    steps = trace.of("step")
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert all(s["forward_s"] > 0 and s["schedule_s"] >= 0 for s in steps)
    assert any(s["preempted"] for s in steps) and any(s["forks"] for s in steps)
    assert all(len(s["preemption_reasons"]) == len(s["preempted"]) for s in steps)
    assert any("out of KV blocks" in reason for s in steps for reason in s["preemption_reasons"])
    assert any(s["cache_hits"] for s in steps)
    assert [e["request_id"] for e in trace.of("abort")] == ["aborted"]
    finishes = {event["request_id"]: event for event in trace.of("finish")}
    assert set(finishes) == set(arrivals) and finishes["aborted"]["reasons"] == ["abort"]
    assert finishes["r1"]["output_tokens"] == 20 and finishes["r1"]["ttft"] > 0


def test_replay_schedules_every_recorded_step(trace_path):
    num_matched, divergence = replay(Trace.load(trace_path))
    assert divergence is None, str(divergence)
    assert num_matched == len(Trace.load(trace_path).of("step"))


def test_replay_reports_the_step_where_a_decision_changed(trace_path, tmp_path):
    lines = trace_path.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    target = next(e for e in events if e["event"] == "step" and e["step"] >= 5 and len(e["chunks"]) > 1)
    target["chunks"] = target["chunks"][::-1]  # the same work in another order: a different decision
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    num_matched, divergence = replay(Trace.load(changed))
    assert divergence is not None and divergence.step == target["step"] and num_matched == target["step"]
    assert "recorded" in str(divergence) and "replayed" in str(divergence)


def test_show_export_and_what_if_from_the_command_line(trace_path, tmp_path, capsys):
    from radixlm.cli import main

    main(["replay", str(trace_path)])
    assert "0 divergences" in capsys.readouterr().out
    main(["trace", "show", str(trace_path), "--request", "r3"])
    shown = capsys.readouterr().out
    assert "arrival" in shown and "prefill chunk" in shown and "first token" in shown and "finished" in shown
    assert "cache hit" in shown and "decode" in shown
    main(["trace", "show", str(trace_path), "--request", "forked"])
    assert "forked#2 forked from forked" in capsys.readouterr().out

    out = tmp_path / "chrome.json"
    main(["trace", "export", str(trace_path), "--chrome", str(out)])
    exported = json.loads(out.read_text())
    assert exported["traceEvents"]
    for event in exported["traceEvents"]:  # the Trace Event format's required fields
        assert {"name", "ph", "pid", "tid"} <= set(event)
        assert event["ph"] in ("X", "i", "M")
        if event["ph"] != "M":
            assert isinstance(event["ts"], float) and event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0
    assert {e["args"]["name"] for e in exported["traceEvents"] if e["name"] == "thread_name"} >= {"r0", "late"}

    main(["replay", str(trace_path), "--max-num-batched-tokens", "12"])
    table = capsys.readouterr().out
    assert "| recorded |" in table and "| model, recorded flags |" in table and "what-if" in table
