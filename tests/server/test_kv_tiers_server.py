"""The KV tiers behind the server: an int8 cache with a host and a disk tier answers revisited prefixes from the
tiers (same text as computing them), shows them in /metrics, and a server started again on the same directory
serves a saved prefix from disk."""

from __future__ import annotations

import re

import torch

from server.inprocess import InProcessApp


def _metrics(app: InProcessApp) -> dict[str, float]:
    text = app.request("GET", "/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^radixlm:(\w+?)(?:_total)?\{[^}]*\} (\S+)$", text, re.MULTILINE)}


def _complete(app: InProcessApp, prompt: list[int]) -> str:
    response = app.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_tiers_answer_revisited_prefixes_and_survive_a_restart(tiny_model_dir, tmp_path):
    options = {"num_kv_blocks": 24, "block_size": 4, "kv_cache_dtype": "int8", "kv_offload_memory": "1MiB",
               "kv_offload_dir": str(tmp_path)}
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 300, (40,), generator=generator).tolist() for _ in range(4)]
    app = InProcessApp(tiny_model_dir("llama"), options)
    try:
        first = [_complete(app, prompt) for prompt in prompts]  # each pushes the one before out of 24 blocks
        assert [_complete(app, prompt) for prompt in prompts] == first
        metrics = _metrics(app)
        assert metrics["kv_cache_capacity_tokens"] == 96
        assert metrics["host_cache_hit_tokens"] >= 3 * 36 and metrics["kv_offloaded_bytes"] > 0
        assert metrics["kv_host_leaked_blocks"] == 0
    finally:
        app.close()  # a clean shutdown: the cached prefixes go to disk
    assert list(tmp_path.rglob("*.kv"))
    restarted = InProcessApp(tiny_model_dir("llama"), options)
    try:
        assert _complete(restarted, prompts[-1]) == first[-1]
        metrics = _metrics(restarted)
        assert metrics["kv_disk_read_blocks"] > 0 and metrics["kv_disk_failed_blocks"] == 0
        assert metrics["kv_disk_leaked_files"] == 0
    finally:
        restarted.close()
