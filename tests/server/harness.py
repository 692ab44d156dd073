"""`ServerAccess`, how tests reach a server wherever it runs; `start_server` runs the real `radixlm serve` in a
subprocess on a free loopback port (for what only a process shows: startup, signals, exit codes, disconnects)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key"
LONG_CONTEXT = 4096  # the long_model_dir fixture's context
# The KV budget of a test server unless its flags say otherwise: the default (a tenth of free memory, ~2 GB here) is
# committed at start, and in a VM that hands freed memory back to its host, first touching 2 GB took 3-8 s a start.
TEST_KV_BUDGET = ("--kv-cache-memory", "256MiB")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerAccess:
    """How a test reaches a server, wherever it runs: `http` is a raw httpx client carrying the API key (for odd
    requests), `client()` / `async_client()` official openai clients, `metrics()` / `wait_for()` read /metrics.
    A subclass sets `base_url` and `api_key`, and transports when the app is not behind a socket."""

    base_url: str
    api_key: str | None
    http: httpx.Client

    def sync_transport(self) -> httpx.BaseTransport | None:
        return None  # httpx's own: a socket to base_url

    def async_transport(self) -> httpx.AsyncBaseTransport | None:
        return None

    def http_client(self, with_key: bool = True, **kwargs: Any) -> httpx.Client:
        """A raw client on the server; `with_key=False` leaves the Authorization header out."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key and with_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60, transport=self.sync_transport(),
                            **kwargs)

    def client(self, api_key: str | None = None, **kwargs: Any) -> openai.OpenAI:
        transport = self.sync_transport()
        http_client = httpx.Client(transport=transport) if transport else None
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key or self.api_key or "unused",
                             max_retries=0, timeout=120, http_client=http_client, **kwargs)

    def async_client(self) -> openai.AsyncOpenAI:
        transport = self.async_transport()
        http_client = httpx.AsyncClient(transport=transport) if transport else None
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key or "unused", max_retries=0,
                                  timeout=300, http_client=http_client)

    def metrics(self) -> dict[str, float]:
        """Every sample as `name{label=value,...}` -> value (labels sorted, model_name left out)."""
        samples = {}
        for family in text_string_to_metric_families(self.http.get("/metrics").text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
                samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "condition") -> dict[str, float]:
        """Poll /metrics until `predicate(metrics)` holds; returns the metrics that satisfied it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            metrics = self.metrics()
            if predicate(metrics):
                return metrics
            time.sleep(0.05)
        raise TimeoutError(f"{what} did not happen within {timeout} s; metrics: {self.metrics()}")


@dataclass
class ServerProcess(ServerAccess):
    """`radixlm serve` in a subprocess, reached over a loopback socket."""

    process: subprocess.Popen
    port: int
    log_path: Path
    api_key: str | None = None
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = self.http_client()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if self.http.get("/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        self.http.close()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"server did not exit within {timeout} s after signal {sig}:\n{self.log()}") \
                from None


def launch(command: list[str], log_path: Path, port: int, api_key: str | None = None) -> ServerProcess:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
    return ServerProcess(process, port, log_path, api_key)


def start_server(model: str | Path, tmp_dir: Path, *args: str, api_key: str | None = None,
                 wait: bool = True) -> ServerProcess:
    """`radixlm serve --model MODEL --port <free> ARGS...` (with `TEST_KV_BUDGET` unless ARGS size the KV cache),
    waiting for /health to answer 200."""
    port = free_port()
    command = [sys.executable, "-m", "radixlm.cli", "serve", "--model", str(model), "--port", str(port),
               "--num-threads", "1", *TEST_KV_BUDGET, *args]  # a later flag overrides an earlier one
    if api_key:
        command += ["--api-key", api_key]
    server = launch(command, tmp_dir / f"server-{port}.log", port, api_key)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.stop(signal.SIGKILL)
            raise
    return server
