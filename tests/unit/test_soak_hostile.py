"""`radixlm bench soak --hostile`: its request builders, response framing checks and PASS rules, without a server."""

from __future__ import annotations

import json
import math
import socket
import threading
from collections import Counter

import pytest

from radixlm.bench.soak import parse_state
from radixlm.bench.soak_attack import HostileTally, TinyTrickle, exchange_raw, fold_tiny, warm_up_attacks
from radixlm.bench.soak_hostile import (
    ATTACK_KINDS,
    BIG_ARGUMENTS_CHARS,
    FRAMING_BODY,
    KIND_BIG_ARGUMENTS,
    KIND_BIG_TOOLS,
    KIND_FRAMING,
    KIND_SCHEMA,
    KIND_TOOL_SCHEMA,
    NUM_SCHEMA_PROPERTIES,
    SMUGGLED,
    big_arguments_request,
    big_tools_request,
    build_attacks,
    classify_framing,
    framing_request,
    parse_responses,
    pattern_schema,
    schema_request,
    tiny_requests,
    tool_schema_request,
)
from radixlm.bench.soak_verdict import (
    GRAMMAR_BUDGET,
    GRAMMAR_BYTES,
    TINY_P99_LIMIT,
    hostile_passed,
    print_hostile,
    rss_limit,
    tiny_p99,
)
from radixlm.structured.grammar_spec import MAX_SPEC_CHARS

MAX_REQUEST_BYTES = 16 * 2**20  # `radixlm serve`'s default --max-request-bytes
MiB = 2**20


def test_a_schema_is_about_84_kb_of_patterned_strings() -> None:
    schema = pattern_schema(3)
    assert schema["type"] == "object" and len(schema["properties"]) == NUM_SCHEMA_PROPERTIES
    assert all(p["type"] == "string" and p["pattern"].startswith("^[a-z]{") for p in schema["properties"].values())
    assert 80_000 <= len(json.dumps(schema)) <= 95_000


def test_schemas_are_distinct_per_seed_and_per_request() -> None:
    assert len({json.dumps(pattern_schema(seed)) for seed in range(20)}) == 20
    attacks = build_attacks(6, seed=1)
    for kind in (KIND_SCHEMA, KIND_TOOL_SCHEMA):
        bodies = [a.body for a in attacks if a.kind == kind]
        assert len(bodies) == 6 and len(set(bodies)) == 6


def test_schema_requests_ask_one_token_under_a_json_schema() -> None:
    body = json.loads(schema_request(5).body)
    assert body["max_tokens"] == 1 and body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == pattern_schema(5)


def test_tool_schema_requests_require_a_call_of_tools_with_distinct_schemas() -> None:
    body = json.loads(tool_schema_request(5).body)
    assert body["tool_choice"] == "required" and body["max_tokens"] == 1
    schemas = [json.dumps(tool["function"]["parameters"]) for tool in body["tools"]]
    assert len(schemas) >= 2 and len(set(schemas)) == len(schemas)
    assert all(len(s) >= 80_000 for s in schemas)
    assert sum(len(s) for s in schemas) < MAX_SPEC_CHARS  # the tools' grammar is compiled, not refused for size


def test_the_framing_request_hides_a_second_request_in_its_content_length_span() -> None:
    raw = framing_request().body
    head, _, span = raw.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1"
    headers = [line.split(":", 1) for line in lines[1:]]
    names = [name.lower() for name, _ in headers]
    values = {name.lower(): value.strip() for name, value in headers}
    assert names.count("content-length") == 1 and names.count("transfer-encoding") == 1
    assert values["transfer-encoding"] == "chunked" and int(values["content-length"]) == len(span)
    size, _, rest = span.partition(b"\r\n")  # the chunked reading: one chunk, the last chunk, then SMUGGLED
    chunk = rest[:int(size, 16)]
    assert chunk == FRAMING_BODY and rest[len(chunk):] == b"\r\n0\r\n\r\n" + SMUGGLED
    assert SMUGGLED.startswith(b"GET /v1/models HTTP/1.1\r\n") and SMUGGLED.endswith(b"\r\n\r\n")


def test_the_big_arguments_hold_12_mb_of_valid_json() -> None:
    body = big_arguments_request().body
    assert len(body) < MAX_REQUEST_BYTES
    messages = json.loads(body)["messages"]
    arguments = messages[1]["tool_calls"][0]["function"]["arguments"]
    assert len(arguments) == BIG_ARGUMENTS_CHARS == 12_000_000
    assert set(json.loads(arguments)) == {"notes"}
    assert messages[2]["role"] == "tool" and messages[2]["tool_call_id"] == "call_0"


def test_the_big_tools_are_128_tools_of_100_kb_each() -> None:
    body = big_tools_request().body
    assert len(body) < MAX_REQUEST_BYTES
    tools = json.loads(body)["tools"]
    assert len(tools) == 128 and len({t["function"]["name"] for t in tools}) == 128
    assert all(len(t["function"]["description"]) == 100 * 1024 for t in tools)


def test_every_kind_is_built_and_the_warm_up_leaves_the_grammars_out() -> None:
    assert Counter(a.kind for a in build_attacks(3, seed=0)) == {kind: 3 for kind in ATTACK_KINDS}
    assert {a.kind for a in warm_up_attacks(0)} == {KIND_FRAMING, KIND_BIG_TOOLS, KIND_BIG_ARGUMENTS}
    routes = [route for route, _ in tiny_requests()]
    assert routes == ["/tokenize", "/v1/chat/completions"]
    assert json.loads(tiny_requests()[1][1])["max_tokens"] == 1


def _response(status: int, headers: dict[str, str], body: bytes) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_framing_outcomes() -> None:
    refused = _response(400, {"connection": "close"}, b'{"error": {}}')
    models = _response(200, {}, b'{"object": "list", "data": []}')
    assert classify_framing(parse_responses(refused), closed=True) == "refused"
    assert classify_framing(parse_responses(refused + models), closed=True) == "smuggled"
    assert classify_framing(parse_responses(refused), closed=False) == "400 but the socket stayed open"
    assert classify_framing(parse_responses(_response(400, {}, b"{}")), closed=True) == \
        "400 without Connection: close"
    assert classify_framing(parse_responses(_response(200, {}, b"{}")), closed=True) == "answered 200"
    assert classify_framing([], closed=True) == "closed without a response"
    with pytest.raises(ValueError):
        parse_responses(b"garbage\r\n\r\n")


def _passing_tally() -> HostileTally:
    tally = HostileTally()
    tally.tiny_latencies = [0.01 * (i + 1) for i in range(100)]  # 0.01 .. 1.00 s
    tally.framing_outcomes["refused"] = 4
    return tally


def test_tiny_p99_interpolates_and_is_inf_without_answers() -> None:
    assert tiny_p99(_passing_tally()) == pytest.approx(0.9901)
    assert tiny_p99(HostileTally()) == math.inf


def test_the_hostile_pass_rule() -> None:
    assert hostile_passed(_passing_tally())
    assert not hostile_passed(HostileTally())  # no tiny request answered
    slow = _passing_tally()
    slow.tiny_latencies[-2:] = [TINY_P99_LIMIT + 0.5, 2.0]
    assert not hostile_passed(slow)
    for name in ("num_5xx", "num_dropped", "num_unexpected"):
        tally = _passing_tally()
        setattr(tally, name, 1)
        assert not hostile_passed(tally), name
    smuggled = _passing_tally()
    smuggled.framing_outcomes["smuggled"] = 1
    assert not hostile_passed(smuggled)


def test_recording_answers() -> None:
    tally = HostileTally()
    allowed = frozenset({200, 400})
    for status in (200, 400, 503, 404, None):
        tally.record(KIND_SCHEMA, status, allowed, 0.5, "detail")
    assert tally.statuses[KIND_SCHEMA] == {"200": 1, "400": 1, "503": 1, "404": 1, "dropped": 1}
    assert (tally.num_5xx, tally.num_unexpected, tally.num_dropped) == (1, 1, 1)
    assert len(tally.latencies[KIND_SCHEMA]) == 4 and len(tally.problems) == 3


def test_tiny_results_fold_into_the_tally() -> None:
    trickle = TinyTrickle("http://127.0.0.1:1", 0.1)  # never started
    trickle.latencies = [0.02, 0.03]
    trickle.route_latencies = {"/tokenize": [0.02], "/v1/chat/completions": [0.03]}
    trickle.statuses = Counter({"200": 2, "500": 1, "dropped": 2, "429": 1, "timeout": 1})
    tally = HostileTally()
    fold_tiny(trickle, tally)
    assert tally.tiny_latencies == [0.02, 0.03] and tally.tiny_route_latencies["/tokenize"] == [0.02]
    assert (tally.num_5xx, tally.num_dropped, tally.num_unexpected) == (1, 2, 2)


def test_the_rss_limit_allows_for_the_grammar_budget() -> None:
    warm = {"process_resident_memory_bytes": 600 * MiB}
    final = {"process_resident_memory_bytes": 900 * MiB, GRAMMAR_BUDGET: 512 * MiB}
    limit, rule = rss_limit(warm, final, hostile=True)
    assert limit == pytest.approx(1.1 * 1112 * MiB) and "budget 512 MiB" in rule
    limit, rule = rss_limit(warm, {"process_resident_memory_bytes": 900 * MiB}, hostile=True)
    assert limit == pytest.approx(1.1 * 600 * MiB) and "no radixlm:grammar_cache_budget_bytes" in rule
    assert rss_limit(warm, final, hostile=False)[0] == pytest.approx(1.1 * 600 * MiB)


def test_state_sums_every_replica() -> None:
    text = "\n".join([
        "# HELP radixlm:kv_cache_used_blocks KV cache blocks held by live requests.",
        '# TYPE radixlm:kv_cache_used_blocks gauge',
        'radixlm:kv_cache_used_blocks{model_name="m",replica="0"} 0.0',
        'radixlm:kv_cache_used_blocks{model_name="m",replica="1"} 3.0',
        'radixlm:num_requests_running{model_name="m",replica="0"} 1.0',
        'radixlm:num_requests_running{model_name="m",replica="1"} 0.0',
        'radixlm:grammar_cache_budget_bytes{model_name="m",replica="0"} 1048576.0',
        'radixlm:grammar_cache_budget_bytes{model_name="m",replica="1"} 1048576.0',
        "process_resident_memory_bytes 6.5e+08",
        "radixlm:kv_cache_used_blocks_total 9.0",
    ])
    state = parse_state(text)
    assert state["radixlm:kv_cache_used_blocks"] == 3.0 and state["radixlm:num_requests_running"] == 1.0
    assert state[GRAMMAR_BUDGET] == 2 * 1048576 and state["process_resident_memory_bytes"] == 6.5e8
    assert "radixlm:num_requests_waiting" not in state


def test_the_report_names_every_kind_and_the_tiny_percentiles(capsys: pytest.CaptureFixture[str]) -> None:
    tally = _passing_tally()
    tally.tiny_route_latencies = {"/tokenize": tally.tiny_latencies[:50], "/v1/chat/completions": [0.5]}
    tally.record(KIND_SCHEMA, 400, frozenset({200, 400}), 2.0, "too big")
    rss = "process_resident_memory_bytes"
    print_hostile(tally, 12.0, {rss: 600 * MiB, GRAMMAR_BYTES: 0.0},
                  {rss: 900 * MiB, GRAMMAR_BYTES: 300 * MiB, GRAMMAR_BUDGET: 512 * MiB})
    out = capsys.readouterr().out
    assert all(f"  {kind}:" in out for kind in ATTACK_KINDS) and "schema: 400: 1" in out
    assert "p99 0.990 s" in out and "/tokenize: 50;" in out and "300 MiB held of a 512 MiB budget" in out
    assert "600 MiB before (grammar cache 0 MiB), 900 MiB after" in out
    print_hostile(HostileTally(), 1.0, {}, {})
    out = capsys.readouterr().out
    assert "none answered" in out and "missing from /metrics" in out


def _one_answer(answer: bytes, close: bool) -> tuple[int, threading.Thread, threading.Event]:
    """A loopback listener (not a radixlm server) that reads one request, answers `answer`, then closes the
    connection or holds it until the returned event is set."""
    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def serve() -> None:
        with listener, listener.accept()[0] as connection:
            connection.recv(65536)
            connection.sendall(answer)
            if not close:
                release.wait(5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, release


@pytest.mark.parametrize("close", [True, False])
def test_a_raw_exchange_reads_until_the_server_closes_or_goes_quiet(close: bool) -> None:
    answer = _response(400, {"connection": "close"}, b"{}")
    port, thread, release = _one_answer(answer, close)
    data, closed = exchange_raw("127.0.0.1", port, framing_request().body, quiet=0.2, first_byte=5)
    release.set()
    thread.join()
    assert data == answer and closed == close
    assert classify_framing(parse_responses(data), closed) == ("refused" if close else
                                                               "400 but the socket stayed open")
