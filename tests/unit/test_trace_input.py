"""`radixlm replay` / `trace show` / `trace export` on hostile trace files: a real recorded trace, corrupted one
field or one line at a time, is refused with a TraceError naming the file, the line, the event and the field, and on
the command line with one `radixlm: error:` line and exit status 2, never a traceback."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from radixlm.cli import main
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams
from radixlm.trace import trace_file
from radixlm.trace.replay import Trace, replay
from radixlm.trace.trace_fields import TraceError

Events = list[dict[str, Any]]
Mutation = Callable[[Events], int]  # breaks events in place; returns the index (file line - 1) of the one it broke
DELETE = object()  # set_field's value that deletes the field
SHARED = list(range(20, 32))


@pytest.fixture(scope="module")
def recorded(tiny_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Events:
    """A small real trace: chunked prefill, prefix hits, preemption, an n=2 fork, drafts, an abort, a late arrival."""
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    engine = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=12, block_size=4,
                          max_num_batched_tokens=16, trace=str(path),
                          speculative_config='{"method": "ngram", "prompt_lookup_min": 1}')
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request("r0", [*SHARED, 40, 41], greedy)
    engine.add_request("r1", [*SHARED, 42, 43, 44], greedy)
    engine.add_request("forked", list(range(100, 106)), SamplingParams(n=2, seed=1, max_tokens=4, ignore_eos=True))
    engine.add_request("aborted", list(range(60, 66)), greedy)
    engine.step()
    engine.abort_request("aborted")
    engine.add_request("late", [*SHARED, 9, 9], greedy)
    while engine.has_unfinished_requests():
        engine.step()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    assert any(s["forks"] for s in steps) and any(s["preempted"] for s in steps) and any(s["drafts"] for s in steps)
    return events


def nth(events: Events, kind: str, where: Callable[[dict[str, Any]], Any] = bool) -> int:
    return next(i for i, e in enumerate(events) if e["event"] == kind and where(e))


def set_field(kind: str, path: tuple[Any, ...], value: Any, where: Callable[[dict[str, Any]], Any] = bool) -> Mutation:
    """A mutation: set (or DELETE) one field of the first `kind` event that `where` accepts; returns its index."""
    def mutate(events: Events) -> int:
        index = nth(events, kind, where)
        target = events[index]
        for key in path[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = copy.deepcopy(value)
        return index
    return mutate


def insert_after(kind: str, event: Callable[[Events], dict[str, Any]],
                 where: Callable[[dict[str, Any]], Any] = bool) -> Mutation:
    def mutate(events: Events) -> int:
        index = nth(events, kind, where) + 1
        events.insert(index, event(events))
        return index
    return mutate


def decodes(seq_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: any(c[0] == seq_id and c[2] == 1 for c in e["chunks"]) and not e["drafts"]


def write(path: Path, events: Events) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


REQUIRED = {"config": ("version", "scheduler", "num_blocks", "block_size", "enable_prefix_caching", "max_model_len",
                       "eos_token_ids"),
            "arrival": ("time", "step", "request_id", "prompt_token_ids", "prompt_len", "params", "priority",
                        "queued"),
            "abort": ("time", "step", "request_id"),
            "step": ("step", "time", "schedule_s", "forward_s", "sample_s", "outputs_s", "chunks", "preempted",
                     "forks", "sampled", "ended", "cache_hits", "kv_used_blocks", "num_running", "num_waiting"),
            "finish": ("time", "request_id", "reasons", "error", "output_tokens", "ttft", "e2e")}
BAD_VALUES = [  # (kind, field path, value, what the message must name)
    *[("config", ("num_blocks",), v, "num_blocks") for v in (0, -1, 10**12, True, 1.5, "40", None)],
    *[("config", ("block_size",), v, "block_size") for v in (0, 3, 10**9)],
    *[("config", ("max_model_len",), v, "max_model_len") for v in (0, 1, -5, 10**30)],
    ("config", ("version",), 2, "version"), ("config", ("version",), True, "version"),
    ("config", ("enable_prefix_caching",), "yes", "enable_prefix_caching"),
    *[("config", ("eos_token_ids",), v, "eos_token_ids") for v in ([-1], ["2"], 7, [2**40])],
    ("config", ("scheduler",), [], "scheduler"), ("config", ("scheduler", "bogus"), 1, "scheduler.bogus"),
    *[("config", ("scheduler", "max_num_seqs"), v, "scheduler.max_num_seqs") for v in (0, "x", 10**12)],
    ("config", ("scheduler", "schedule_policy"), "nope", "schedule_policy"),
    ("config", ("scheduler", "max_sequences_per_request"), 10**9, "max_sequences_per_request"),
    ("config", ("scheduler", "speculative_config"), '{"method": "beam"}', "speculative_config"),
    ("config", ("scheduler", "speculative_config"), "[" * 10_000, "nested too deeply"),
    *[("arrival", ("time",), v, "time") for v in ("0", 1e300, -1e300)],
    ("arrival", ("step",), -1, "step"), ("arrival", ("step",), 1.0, "step"),
    *[("arrival", ("request_id",), v, "request_id") for v in (5, "", "a\nb", "x" * 5000)],
    ("arrival", ("request_id",), "\ud800", "lone surrogate"),
    *[("arrival", ("prompt_token_ids",), v, "prompt_token_ids")
      for v in ([], [-1], [1.5], [True], [None], "abc", [2**40], list(range(1000)))],
    ("arrival", ("prompt_len",), 999, "prompt_len"),
    ("arrival", ("params",), "x", "params"), ("arrival", ("params", "bogus"), 1, "bogus"),
    ("arrival", ("params", "n"), 10**9, "params.n"), ("arrival", ("params", "n"), 65, "params.n"),
    ("arrival", ("params", "best_of"), 10**9, "params.best_of"),
    ("arrival", ("params", "temperature"), -1, "temperature"), ("arrival", ("params", "temperature"), "hot", "temp"),
    ("arrival", ("params", "max_tokens"), -1, "max_tokens"), ("arrival", ("params", "stop"), [""], "stop"),
    ("arrival", ("params", "logit_bias"), {"x": 1}, "logit_bias"),
    ("arrival", ("params",), {"min_tokens": 10**6, "max_tokens": None}, "min_tokens"),
    ("arrival", ("params", "structured_outputs"), {"kind": "regex", "text": ""}, "regex"),
    *[("arrival", ("priority",), v, "priority") for v in ("high", 2**70, 1.5)],
    ("arrival", ("queued",), "yes", "queued"), ("arrival", ("metadata",), "x", "metadata"),
    ("abort", ("request_id",), "ghost", "ghost"), ("abort", ("time",), [], "time"),
    *[("step", ("forward_s",), v, "forward_s") for v in (-1, 1e300, "fast")],
    ("step", ("chunks",), "x", "chunks"), ("step", ("chunks", 0), ["r0", 0], "chunks[0]"),
    ("step", ("chunks", 0, 0), "ghost", "ghost"), ("step", ("chunks", 0, 0), 7, "chunks[0][0]"),
    ("step", ("chunks", 0, 1), -1, "chunks[0][1]"), ("step", ("chunks", 0, 2), 0, "chunks[0][2]"),
    ("step", ("sampled",), [["ghost", 5]], "ghost"), ("step", ("sampled", 0, 1), -1, "sampled[0][1]"),
    ("step", ("sampled", 0, 1), 2**40, "sampled[0][1]"),
    ("step", ("sampled",), [["aborted", 5]], "neither computes nor forks"),
    ("step", ("ended",), [["r0", "BOGUS"]], "ended[0][1]"), ("step", ("ended",), [["r0", "RUNNING"]], "ended[0][1]"),
    ("step", ("ended",), [["ghost", "FINISHED_LENGTH"]], "ghost"),
    ("step", ("forks",), [["r0", "forked#1", 6]], "forks[0]"), ("step", ("forks",), [[1, 2]], "forks[0]"),
    ("step", ("forks",), [["forked", "ghost", 6]], "ghost"),
    ("step", ("drafts",), {"ghost": [1]}, "ghost"), ("step", ("drafts",), {"r0": [1] * 17}, "drafts"),
    ("step", ("drafts",), {"r0": []}, "drafts"), ("step", ("drafts",), "x", "drafts"),
    ("step", ("drafts",), {"aborted": [1]}, "neither computes nor forks"),
    ("step", ("cache_hits",), {"r0": -1}, "cache_hits"), ("step", ("cache_hits",), {"ghost": 3}, "ghost"),
    ("step", ("cache_hits",), [], "cache_hits"), ("step", ("forward_failed",), "no", "forward_failed"),
    ("step", ("num_running",), -1, "num_running"),
    ("finish", ("ttft",), "x", "ttft"), ("finish", ("output_tokens",), -1, "output_tokens"),
    ("finish", ("reasons",), "length", "reasons"), ("finish", ("error",), 5, "error"),
    ("finish", ("request_id",), "ghost", "ghost"),
]
STATIC = [
    *[pytest.param(set_field(kind, (name,), DELETE), f"{name} is missing", id=f"{kind}-no-{name}")
      for kind, names in REQUIRED.items() for name in names],
    *[pytest.param(set_field(kind, path, value), expected, id=f"{kind}-{'.'.join(map(str, path))}={value!r:.20}")
      for kind, path, value, expected in BAD_VALUES],
    pytest.param(set_field("step", ("preemption_reasons",), [], lambda e: e["preempted"]), "preemption_reasons",
                 id="reasons-not-one-per-preemption"),
    pytest.param(insert_after("arrival", lambda events: events[nth(events, "arrival")]), "live",
                 id="arrival-of-a-live-id"),
    pytest.param(insert_after("arrival", lambda _: {"event": "queued", "time": 0.0, "step": 0, "request_id": "r0"}),
                 "unqueued", id="queued-but-arrived-queued"),
    pytest.param(insert_after("finish", lambda events: events[nth(events, "finish")]), "not a live request",
                 id="finish-twice"),
    pytest.param(insert_after("arrival", lambda _: {"event": "bogus"}), "event must be one of", id="unknown-kind"),
    pytest.param(insert_after("arrival", lambda _: {"event": [1]}), "event must be one of", id="kind-not-a-string"),
    pytest.param(insert_after("arrival", lambda _: {"time": 0}), "event is missing", id="no-kind"),
    pytest.param(insert_after("arrival", lambda events: events[0]), "config may only be the first", id="config-twice"),
    pytest.param(lambda events: events.insert(0, events.pop(1)) or 0, "must be config", id="config-not-first"),
]
REPLAYED = [  # each event is well formed, but contradicts what the replay's scheduler holds at that point
    pytest.param(set_field("step", ("sampled",), [["r0", 5], ["r0", 6]], decodes("r0")), "gets 2 tokens",
                 id="two-tokens-from-one-row"),
    pytest.param(set_field("step", ("drafts",), {"r0": [5]}), "not running", id="drafts-of-a-waiting-sequence"),
    pytest.param(set_field("step", ("ended",), [["forked#1", "FINISHED_LENGTH"]]), "illegal transition",
                 id="unforked-sequence-ends-by-length"),
]


def refusal(path: Path) -> str:
    with pytest.raises(TraceError) as caught:
        Trace.load(path)
    return str(caught.value)


def cli_refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(list(argv))
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.startswith("radixlm: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("mutate", "expected"), STATIC)
def test_a_corrupted_trace_is_a_named_error(recorded, tmp_path, capsys, mutate, expected):
    events = copy.deepcopy(recorded)
    index = mutate(events)
    write(tmp_path / "bad.jsonl", events)
    message = refusal(tmp_path / "bad.jsonl")
    assert message.startswith(f"{tmp_path / 'bad.jsonl'} line {index + 1}") and expected in message, message
    assert "\n" not in message and expected in cli_refusal(capsys, "replay", str(tmp_path / "bad.jsonl"))


@pytest.mark.parametrize(("mutate", "expected"), REPLAYED)
def test_a_trace_that_contradicts_its_replay_is_a_named_error(recorded, tmp_path, capsys, mutate, expected):
    events = copy.deepcopy(recorded)
    index = mutate(events)
    write(tmp_path / "bad.jsonl", events)
    trace = Trace.load(tmp_path / "bad.jsonl")  # every event is well formed on its own
    with pytest.raises(TraceError) as caught:
        replay(trace)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'bad.jsonl'} line {index + 1} (step event): ") and expected in message
    assert "\n" not in message and expected in cli_refusal(capsys, "replay", str(tmp_path / "bad.jsonl"))


@pytest.mark.parametrize("mutate", [
    set_field("step", ("forks",), [["forked", "forked#1", 6]], lambda e: e["chunks"][-1][0] == "forked"
              and e["chunks"][-1][1] == 0),
    set_field("step", ("forks",), [["forked", "forked#1", 6]], decodes("forked"))], ids=["early", "twice"])
def test_a_fork_the_scheduler_does_not_make_is_a_divergence(recorded, tmp_path, mutate):
    """Forks are the scheduler's decisions (it owns the sequences of a request): one recorded where the replayed
    scheduler makes none is a divergence at that step, like a chunk it does not schedule."""
    events = copy.deepcopy(recorded)
    mutate(events)
    write(tmp_path / "bad.jsonl", events)
    _, divergence = replay(Trace.load(tmp_path / "bad.jsonl"))
    assert divergence is not None and '"forks": [["forked", "forked#1"]]' in str(divergence)


def test_show_and_export_refuse_a_corrupted_trace_too(recorded, tmp_path, capsys):
    events = copy.deepcopy(recorded)
    set_field("arrival", ("params", "n"), 10**9)(events)
    write(tmp_path / "bad.jsonl", events)
    assert "params.n" in cli_refusal(capsys, "trace", "show", str(tmp_path / "bad.jsonl"), "--request", "r0")
    assert "params.n" in cli_refusal(capsys, "trace", "export", str(tmp_path / "bad.jsonl"), "--chrome",
                                     str(tmp_path / "out.json"))
    assert not (tmp_path / "out.json").exists()


def raw_line(text: str, line: int = 2) -> Callable[[list[str]], None]:
    """A mutation of the file's text: replace line `line` (1-based) with `text`."""
    return lambda lines: lines.__setitem__(line - 1, text)


FILES = [  # (how to corrupt the recorded file's lines, or None: write these bytes; what the message must name)
    pytest.param(lambda lines: lines.clear(), "is empty", id="empty"),
    pytest.param(lambda lines: lines.__setitem__(slice(None), ["  ", ""]), "is empty", id="blank-lines-only"),
    pytest.param(raw_line("{not json"), "line 2: the line is not valid JSON", id="not-json"),
    pytest.param(raw_line("[1, 2]"), "line 2: the line must be a JSON object", id="json-array"),
    pytest.param(raw_line('"hi"'), "line 2: the line must be a JSON object", id="json-string"),
    pytest.param(raw_line("\ufeff" + "{}", 1), "line 1: the line is not valid JSON", id="byte-order-mark"),
    pytest.param(raw_line('{"event": "queued", "time": NaN}'), "NaN", id="nan"),
    pytest.param(raw_line('{"event": "queued", "time": Infinity}'), "Infinity", id="infinity"),
    pytest.param(raw_line('{"event": "queued", "time": -Infinity}'), "-Infinity", id="minus-infinity"),
    pytest.param(raw_line('{"event": "queued", "time": 1e999}'), "out of range", id="overflowing-float"),
    pytest.param(raw_line('{"event": "queued", "time": ' + "9" * 5000 + "}"), "line 2: the line is not valid JSON",
                 id="huge-integer"),
    pytest.param(raw_line('{"event": "' + "\\udc80" + '"}'), "lone surrogate", id="lone-surrogate"),
    pytest.param(raw_line("[" * 100_000 + "]" * 100_000), "nested deeper than", id="deep-nesting"),
    pytest.param(raw_line("{" * 100_000), "nested deeper than", id="deep-unbalanced"),
    pytest.param(raw_line("[" + "1," * (5 * 2**20) + "1]"), "characters long", id="long-line"),
    pytest.param(lambda lines: lines.__setitem__(-1, lines[-1][:-9]), "not valid JSON", id="truncated-last-line"),
]


@pytest.mark.parametrize(("corrupt", "expected"), FILES)
def test_a_corrupted_file_is_a_named_error(recorded, tmp_path, capsys, corrupt, expected):
    lines = [json.dumps(event) for event in recorded]
    corrupt(lines)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogatepass")
    assert expected in refusal(path)
    assert expected in cli_refusal(capsys, "replay", str(path))


def test_unreadable_too_large_and_non_utf8_files_are_named_errors(recorded, tmp_path, capsys, monkeypatch):
    (tmp_path / "bytes.jsonl").write_bytes(json.dumps(recorded[0]).encode() + b"\n\n\xff\xfe\n")
    with (tmp_path / "sparse.jsonl").open("wb") as file:
        file.truncate(trace_file.MAX_TRACE_BYTES + 1)  # sparse: no disk, but more than a trace may hold
    write(tmp_path / "long.jsonl", recorded)
    for name, expected in (("missing.jsonl", "cannot read"), ("", "cannot read"), ("bytes.jsonl", "line 3: not UTF-8"),
                           ("sparse.jsonl", "larger than")):
        assert expected in refusal(tmp_path / name) and expected in cli_refusal(capsys, "replay", str(tmp_path / name))
    monkeypatch.setattr(trace_file, "MAX_EVENTS", 5)
    assert "more than 5 events" in cli_refusal(capsys, "trace", "show", str(tmp_path / "long.jsonl"), "--request", "r0")


def test_the_recorded_trace_replays_shows_and_exports(recorded, tmp_path, capsys):
    write(tmp_path / "trace.jsonl", recorded)
    main(["replay", str(tmp_path / "trace.jsonl")])
    assert "(0 divergences)" in capsys.readouterr().out
    main(["trace", "show", str(tmp_path / "trace.jsonl"), "--request", "aborted"])  # its TTFT is null
    assert "TTFT -" in capsys.readouterr().out
    main(["trace", "export", str(tmp_path / "trace.jsonl"), "--chrome", str(tmp_path / "chrome.json")])
    assert json.loads((tmp_path / "chrome.json").read_text())["traceEvents"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["replay", "{trace}", "--num-kv-blocks", "0"], "--num-kv-blocks"),
    (["replay", "{trace}", "--num-kv-blocks", "-1"], "--num-kv-blocks"),
    (["replay", "{trace}", "--num-kv-blocks", str(10**12)], "--num-kv-blocks"),
    (["replay", "{trace}", "--num-kv-blocks", "2"], "needs"),
    (["replay", "{trace}", "--max-num-seqs", "0"], "--max-num-seqs"),
    (["replay", "{trace}", "--max-num-batched-tokens", str(10**12)], "--max-num-batched-tokens"),
    (["replay", "{trace}", "--schedule-policy", "bogus"], "what-if flags make an invalid scheduler config"),
    (["trace", "show", "{trace}", "--request", "ghost"], "'ghost' is not in {trace}"),
    (["trace", "export", "{trace}", "--chrome", "{dir}/no/such/dir/out.json"], "cannot write"),
    (["trace", "export", "{trace}", "--chrome", "{dir}"], "cannot write"),
])
def test_bad_flags_and_outputs_are_named_errors(recorded, tmp_path, capsys, argv, expected):
    write(tmp_path / "trace.jsonl", recorded)
    argv = [arg.format(trace=tmp_path / "trace.jsonl", dir=tmp_path) for arg in argv]
    assert expected.format(trace=tmp_path / "trace.jsonl") in cli_refusal(capsys, *argv)


def test_the_radixlm_command_prints_one_line_and_no_traceback(recorded, tmp_path):
    events = copy.deepcopy(recorded)
    set_field("arrival", ("params", "n"), 10**9)(events)
    write(tmp_path / "n.jsonl", events)
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "\n")
    for path in (tmp_path / "n.jsonl", tmp_path / "deep.jsonl", tmp_path):
        result = subprocess.run([sys.executable, "-m", "radixlm", "replay", str(path)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("radixlm: error: ") and result.stderr.count("\n") == 1, result.stderr
