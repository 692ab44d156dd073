"""Server lifecycle, on a real `radixlm serve` subprocess: answering while the model loads, a graceful exit on
SIGTERM / SIGINT, exit 1 when the model does not load, and a client disconnecting mid-stream."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from server.harness import API_KEY, LONG_CONTEXT, free_port, launch, start_server

HERE = __file__.rsplit("/", 1)[0]


def test_health_and_requests_answer_503_while_loading(tiny_model_dir, tmp_path):
    release = tmp_path / "release"
    port = free_port()
    command = [sys.executable, f"{HERE}/slow_load_server.py", str(release), "--model", str(tiny_model_dir("llama")),
               "--port", str(port), "--num-kv-blocks", "64", "--num-threads", "1"]
    server = launch(command, tmp_path / "server.log", port)
    try:
        deadline = time.monotonic() + 60
        while True:  # the port opens while the engine is still waiting for the release file
            try:
                health = server.http.get("/health")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.1)
        assert health.status_code == 503 and "loading" in health.json()["error"]["message"]
        chat = server.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "engine_unavailable"
        assert server.http.get("/v1/models").json()["data"][0]["max_model_len"] is None
        release.touch()
        server.wait_ready()
        response = server.client().completions.create(model=str(tiny_model_dir("llama")), prompt="hi", max_tokens=3)
        assert response.usage.completion_tokens == 3
    finally:
        assert server.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_ends_running_requests_with_an_error(sig, long_model_dir, tmp_path):
    server = start_server(long_model_dir, tmp_path, "--num-kv-blocks", "2100", "--block-size", "4")
    try:
        model = str(long_model_dir)
        long_request = {"model": model, "prompt": "the quick", "max_tokens": 4000, "ignore_eos": True,
                        "temperature": 0}
        non_streaming: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: non_streaming.update(
            response=httpx.post(f"{server.base_url}/v1/completions", json=long_request, timeout=60)))
        thread.start()
        with server.http.stream("POST", "/v1/completions", json={**long_request, "stream": True}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: {")
            server.wait_for(lambda m: m["radixlm:num_requests_running{}"] == 2, what="both requests running")
            started = time.monotonic()
            server.process.send_signal(sig)
            events = [line for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert '"error"' in events[-2] and "shutting down" in events[-2]
        thread.join(30)
        assert non_streaming["response"].status_code == 503
        assert "shutting down" in non_streaming["response"].json()["error"]["message"]
        assert server.process.wait(30) in (0, -sig)  # uvicorn re-raises the signal once it has shut down
        assert time.monotonic() - started < 15
        assert "Traceback" not in server.log(), server.log()
    finally:  # a failed check must not leave the server running
        server.stop(signal.SIGKILL)


def test_a_model_that_does_not_load_stops_the_server(tmp_path):
    port = free_port()
    command = [sys.executable, "-m", "radixlm.cli", "serve", "--model", str(tmp_path / "missing"), "--port",
               str(port)]
    server = launch(command, tmp_path / "server.log", port)
    assert server.process.wait(60) == 1
    assert "the engine could not start" in server.log() and "Traceback" not in server.log()


@pytest.fixture
def server(long_model_dir, tmp_path):
    """test_errors.py's server as a subprocess: only a socket lets a client disconnect mid-stream."""
    server = start_server(long_model_dir, tmp_path, "--max-num-seqs", "1", "--max-queued-requests", "1",
                          "--max-request-bytes", "65536", "--num-kv-blocks", str(LONG_CONTEXT // 4 + 8),
                          "--block-size", "4", api_key=API_KEY)
    yield server
    server.stop()


def test_disconnect_mid_stream_frees_kv(server):
    model = server.client().models.list().data[0].id
    before = server.metrics()
    body = {"model": model, "prompt": "the quick brown", "max_tokens": LONG_CONTEXT - 64, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with server.http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert sum(line.startswith("data: {") for line in received) == 3
        mid = server.metrics()
        assert mid["radixlm:num_requests_running{}"] == 1 and mid["radixlm:kv_cache_usage_perc{}"] > 0
    after = server.wait_for(lambda m: m["radixlm:num_requests_running{}"] == 0, what="abort after disconnect")
    assert after["radixlm:kv_cache_usage_perc{}"] == before["radixlm:kv_cache_usage_perc{}"] == 0
    aborted = "radixlm:request_finished_total{finished_reason=abort}"
    assert after.get(aborted, 0) == before.get(aborted, 0) + 1
    generated = after["radixlm:generation_tokens_total{}"] - before["radixlm:generation_tokens_total{}"]
    assert generated < LONG_CONTEXT - 64, "the request ran to the end instead of being aborted"
    # the freed blocks serve the next request
    assert server.client().completions.create(model=model, prompt="hi", max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize("key", ["", "   ", " padded", "k\u00e9y", "tab\tkey"])
def test_an_api_key_no_client_can_send_is_a_startup_error(key, tmp_path):
    """An empty `--api-key` used to turn auth off silently (issue 34, row 7); the environment variable too."""
    command = [sys.executable, "-m", "radixlm.cli", "serve", "--model", str(tmp_path / "never-read"), "--api-key", key]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--api-key" in result.stderr and "Traceback" not in result.stderr, result
    env = {**os.environ, "RADIXLM_API_KEY": key}
    result = subprocess.run(command[:-2], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and "RADIXLM_API_KEY" in result.stderr, result


@pytest.mark.parametrize(("flag", "value", "named"), [
    ("--grammar-cache-bytes", "0", "grammar_cache_bytes"), ("--grammar-cache-bytes", "nan", "grammar_cache_bytes"),
    ("--responses-store-bytes", "12 parsecs", "--responses-store-bytes"),
    ("--responses-store-bytes", "1e40", "--responses-store-bytes")])
def test_a_bad_byte_budget_is_a_startup_error(flag, value, named, tmp_path):
    command = [sys.executable, "-m", "radixlm.cli", "serve", "--model", str(tmp_path / "never-read"), flag, value]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr, result
