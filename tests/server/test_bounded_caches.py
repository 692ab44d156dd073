"""Caches a client fills are bounded in bytes, with the budget a flag and a metric (issue 34, row 1): the grammar
compile cache (`--grammar-cache-bytes` bounds what distinct schemas leave behind; tools compile only when a grammar
uses them) and the Responses API's store (`--responses-store-bytes`)."""

from __future__ import annotations

import re

import pytest

from server.inprocess import InProcessApp

BUDGET = 2**20
STORE_BUDGET = 20_000  # bytes: a few responses of the tiny model's 512-token context


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    app = InProcessApp(tiny_model_dir("llama"), {"grammar_cache_bytes": "1MiB"}, responses_store_bytes=STORE_BUDGET)
    yield app
    app.close()


def schema(seed: int, num_properties: int = 40) -> dict:
    properties = {f"k{seed}_{i}": {"type": "string", "pattern": "[a-z]{1,4}"} for i in range(num_properties)}
    return {"type": "object", "properties": properties}


def gauges(app) -> dict[str, float]:
    text = app.request("GET", "/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^radixlm:(\w+?_(?:bytes|entries|evictions))(?:_total)?\{[^}]*\} (\S+)$", text,
                       re.MULTILINE)}


def chat(app, **fields) -> int:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    return app.post("/v1/chat/completions", body).status_code


def test_distinct_schemas_stay_within_the_budget(app):
    for seed in range(40):
        assert chat(app, response_format={"type": "json_schema", "json_schema": {"name": "s",
                                                                                 "schema": schema(seed)}}) == 200
        held = gauges(app)
        assert 0 < held["grammar_cache_bytes"] <= BUDGET, held
    assert held["grammar_cache_budget_bytes"] == BUDGET and held["grammar_cache_evictions"] > 0, held


def num_compiled(app) -> float:
    """Entries ever cached: those held and those evicted."""
    held = gauges(app)
    return held["grammar_cache_entries"] + held["grammar_cache_evictions"]


def test_tools_compile_only_under_a_forced_choice(app):
    before = num_compiled(app)
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": schema(1000 + i, 10)}} for i in range(3)]
    assert chat(app, tools=tools, tool_choice="none") == 200
    assert num_compiled(app) == before  # nothing compiled
    assert chat(app, tools=tools, tool_choice="required") == 200
    assert num_compiled(app) == before + 1  # the forced grammar alone, not each tool's


def test_the_flag_is_checked():
    from radixlm.cache_config import CacheConfig

    for value in ("0", "-1MiB", "1e40", "12 parsecs", "512KiB", True, float("nan")):
        with pytest.raises(ValueError, match="grammar_cache_bytes"):
            CacheConfig(grammar_cache_bytes=value)
    assert CacheConfig(grammar_cache_bytes="2GiB").grammar_cache_num_bytes == 2**31


def test_the_response_store_is_bounded_and_shown(app):
    text = "the quick brown fox " * 25
    for _ in range(10):  # each stored response holds its input and output (~2.5 KB): 25 KB through a 20 KB store
        response = app.post("/v1/responses", {"input": text, "max_output_tokens": 1})
        assert response.status_code == 200, response.text
        held = gauges(app)
        assert 500 < held["responses_store_bytes"] <= STORE_BUDGET, held
    assert held["responses_store_budget_bytes"] == STORE_BUDGET
