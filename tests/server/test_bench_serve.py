"""`radixlm bench serve` runs its three workloads against a live server and writes its table, JSON and plot."""

from __future__ import annotations

import json

from radixlm.bench.serve import BenchOptions, bench_serve
from radixlm.bench.serve_workloads import WORKLOADS, WorkloadSpec


def test_bench_serve_against_a_running_server(tiny_server, tiny_model_dir, tmp_path, capsys):
    spec = WorkloadSpec(num_prompts=8, input_len=(16, 48), output_len=(4, 8), prefix_len=64, seed=0)
    options = BenchOptions(list(WORKLOADS), spec, request_rate=50.0, max_concurrency=4,
                           output_json=str(tmp_path / "serve.json"), output_png=str(tmp_path / "serve.png"))
    results = bench_serve(tiny_server.base_url, {"model": str(tiny_model_dir("llama"))}, options)
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
