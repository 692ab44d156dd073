"""A fuzzer for /v1/completions and /v1/chat/completions: request bodies built from the OpenAI schema's fields
with hostile values (huge, negative, NaN, 1e-45, wrong types, lone surrogates, giant lists, deep nesting,
unknown fields), sent in process to the app on a tiny random-weight model.

Every answer must be a 2xx, or a 4xx with an OpenAI error body: bad input is never a 5xx. After the run the
engine is alive and answers a greedy request exactly as before it.

`n` and `best_of` include huge values: the engine's admission refuses them (400 naming the field) before it builds
anything for them.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.inprocess import MODEL_NAME, InProcessApp

DEEP = "__DEEP__"  # replaced by a deeply nested JSON array in the body's text
NESTING_DEPTHS = [50, 900, 3000, 100_000]

hostile_numbers = st.one_of(
    st.sampled_from([0, -1, 1, 2**31, -(2**63) - 1, 2**64, 10**30, 10**4000, 1e-45, -1e-45, 1e-38, 1e308,
                     -1e308, 0.5, -0.0, float("nan"), float("inf"), float("-inf")]),
    st.integers(), st.floats())
hostile_strings = st.one_of(st.sampled_from(["", "NaN", "nan", "Infinity", "1e-45", "-1", "\ud800", "a\udfffb",
                                             "\x00", "🙂" * 50, "x" * 100_000, "1" * 5000, "２", "²"]),
                            st.text(max_size=20))
hostile_scalars = st.one_of(hostile_numbers, hostile_strings, st.booleans(), st.none())
hostile_values = st.one_of(
    hostile_scalars,
    st.lists(hostile_scalars, max_size=5),
    st.dictionaries(hostile_strings, hostile_scalars, max_size=4),
    st.sampled_from([[0] * 20_000, ["x"] * 2_000, DEEP]),
)
HOSTILE_ODDS = 6
HOSTILE_COUNTS = st.one_of(st.integers(-3, 3), st.sampled_from(["2", 2.5, None, [], {}, True, float("nan"), 100000,
                                                                 10**9, 2**63, -(2**70)]))


def plausible_or_hostile(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """Hostile one time in HOSTILE_ODDS, so that a body with several fields is often served in full."""
    return st.integers(1, HOSTILE_ODDS).flatmap(lambda k: hostile_values if k == HOSTILE_ODDS else plausible)


token_ids = st.one_of(st.integers(0, 300), st.sampled_from([-1, 383, 384, 10**6, 2**63]))
SAMPLING_FIELDS = {
    "model": plausible_or_hostile(st.sampled_from([MODEL_NAME, None])),
    "temperature": plausible_or_hostile(st.sampled_from([0, 0.7, 1e-45, 1e-38, 1e-5, 1e5, 1e300])),
    "top_p": plausible_or_hostile(st.sampled_from([1e-45, 0.5, 1])),
    "top_k": plausible_or_hostile(st.sampled_from([-1, 0, 1, 5, 10**30])),
    "min_p": plausible_or_hostile(st.sampled_from([0, 0.5, 1])),
    "n": HOSTILE_COUNTS,
    "best_of": HOSTILE_COUNTS,
    "stop": plausible_or_hostile(st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3))),
    "stop_token_ids": plausible_or_hostile(st.lists(token_ids, max_size=3)),
    "seed": plausible_or_hostile(st.integers(-(2**63), 2**64 - 1)),
    "presence_penalty": plausible_or_hostile(st.floats(-2, 2)),
    "frequency_penalty": plausible_or_hostile(st.floats(-2, 2)),
    "repetition_penalty": plausible_or_hostile(st.sampled_from([1e-45, 0.5, 1, 2, 1e300])),
    "logit_bias": plausible_or_hostile(st.dictionaries(st.one_of(token_ids.map(str), hostile_strings),
                                                       st.one_of(st.floats(-100, 100), hostile_numbers),
                                                       max_size=3)),
    "min_tokens": plausible_or_hostile(st.integers(0, 3)),
    "ignore_eos": plausible_or_hostile(st.booleans()),
    "include_stop_str_in_output": plausible_or_hostile(st.booleans()),
    "skip_special_tokens": plausible_or_hostile(st.booleans()),
    "stream": plausible_or_hostile(st.booleans()),
    "stream_options": plausible_or_hostile(st.just({"include_usage": True})),
    "priority": plausible_or_hostile(st.integers(-5, 5)),
    "user": hostile_values,
    "response_format": plausible_or_hostile(st.sampled_from([{"type": "text"}, {"type": "json_object"}, {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}])),
    "regex": plausible_or_hostile(st.sampled_from(["[ab]+", "a(b", ".*"])),
    "choice": plausible_or_hostile(st.lists(st.text(min_size=1, max_size=4), max_size=3)),
    "structured_outputs": hostile_values,
}
COMPLETION_FIELDS = {
    **SAMPLING_FIELDS,
    "prompt": plausible_or_hostile(st.one_of(
        st.text(max_size=30), st.lists(st.text(max_size=10), min_size=1, max_size=3),
        st.lists(token_ids, min_size=1, max_size=10), st.lists(st.lists(token_ids, max_size=5), max_size=3),
        st.just([5] * 600))),
    "logprobs": plausible_or_hostile(st.integers(0, 5)),
    "echo": plausible_or_hostile(st.booleans()),
    "suffix": hostile_values,
}
message = st.fixed_dictionaries(
    {"role": plausible_or_hostile(st.sampled_from(["user", "system", "assistant", "developer", "tool"])),
     "content": plausible_or_hostile(st.one_of(
         st.text(max_size=30), st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                               "text": st.text(max_size=10)}), max_size=2)))},
    optional={"name": hostile_values, "tool_calls": hostile_values})
CHAT_FIELDS = {
    **SAMPLING_FIELDS,
    "messages": plausible_or_hostile(st.lists(message, min_size=1, max_size=3)),
    "max_completion_tokens": plausible_or_hostile(st.integers(1, 3)),
    "logprobs": plausible_or_hostile(st.booleans()),
    "top_logprobs": plausible_or_hostile(st.integers(0, 5)),
    "add_generation_prompt": plausible_or_hostile(st.booleans()),
    "tools": hostile_values,
    "tool_choice": plausible_or_hostile(st.sampled_from(["none", "auto", "required"])),
    "parallel_tool_calls": hostile_values,
    "chat_template_kwargs": plausible_or_hostile(st.dictionaries(st.text(max_size=8), hostile_scalars, max_size=3)),
    "agent_loop": hostile_values,
}


def bodies(path: str, fields: dict[str, st.SearchStrategy], required: str) -> st.SearchStrategy:
    """A body with `required` (maybe hostile), a small max_tokens (maybe hostile, never null: null generates up to
    the context), some of the other fields, and maybe unknown ones."""
    chosen = st.lists(st.sampled_from(sorted(set(fields) - {required})), max_size=5, unique=True)
    return st.tuples(
        st.just(path),
        st.fixed_dictionaries({required: fields[required],
                               "max_tokens": plausible_or_hostile(st.integers(1, 3)).filter(
                                   lambda v: v is not None)}),
        chosen.flatmap(lambda names: st.fixed_dictionaries({name: fields[name] for name in names})),
        st.dictionaries(st.text(max_size=8), hostile_scalars, max_size=2),
        st.sampled_from(NESTING_DEPTHS),
    )


requests = st.one_of(bodies("/v1/completions", COMPLETION_FIELDS, "prompt"),
                     bodies("/v1/chat/completions", CHAT_FIELDS, "messages"))


def encode(body: dict, depth: int) -> bytes:
    text = json.dumps(body)  # NaN / Infinity as Python writes them (Python's parser accepts them too)
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode()


def check_answer(response) -> None:
    status = response.status_code
    assert status < 500, f"{status}: {response.text[:2000]}"
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str), error
        return
    assert status == 200, response.text[:2000]
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", response.text[-2000:]
        for event in events[:-1]:
            payload = json.loads(event)
            assert "error" not in payload or payload["error"]["type"] != "server_error", payload
    else:
        for choice in response.json()["choices"]:
            assert choice["finish_reason"] in ("stop", "length"), choice


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    app = InProcessApp(tiny_model_dir("llama"))
    yield app
    app.close()


GREEDY = {"prompt": "the quick brown", "max_tokens": 8, "temperature": 0}


def test_hostile_bodies_never_get_a_5xx_and_the_engine_survives(app):
    before = app.post("/v1/completions", GREEDY).json()["choices"][0]["text"]
    statuses: list[int] = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(request=requests)
    def fuzz(request):
        path, required, optional, unknown, depth = request
        body = {**unknown, **optional, **required}
        response = app.request("POST", path, content=encode(body, depth),
                               headers={"Content-Type": "application/json"})
        check_answer(response)
        statuses.append(response.status_code)

    fuzz()
    assert statuses.count(200) >= len(statuses) // 10, "the fuzzer hardly reached the engine"
    assert app.request("GET", "/health").status_code == 200
    assert app.post("/v1/completions", GREEDY).json()["choices"][0]["text"] == before
