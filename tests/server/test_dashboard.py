"""GET /dashboard in a real headless Chromium: the page loads with no console errors, its numbers move while
requests run, and a screenshot is saved (test-artifacts/dashboard.png)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from server.harness import REPO_ROOT
from server.inprocess import ThreadedServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = REPO_ROOT / "test-artifacts"
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (apt-get install -y "
                                                         "chromium; .ci/run installs it)")


def chromium(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
               "--virtual-time-budget=3000", *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def numbers(dom: str) -> dict[str, str]:
    return dict(re.findall(r'<div class="value" id="(\w+)">([^<]*)</div>', dom))


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    server = ThreadedServer(tiny_model_dir("llama"), engine_options={"num_kv_blocks": 256, "block_size": 4})
    yield server
    server.stop()


def test_the_dashboard_loads_without_errors_and_its_numbers_move(server, tmp_path):
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            server.http.post("/v1/completions", json={"prompt": "hello there, how are you", "max_tokens": 24,
                                                      "ignore_eos": True, "n": 2})

    workers = [threading.Thread(target=traffic) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        url = f"{server.base_url}/dashboard"
        first = chromium(url, tmp_path, "--dump-dom")
        second = chromium(url, tmp_path, "--dump-dom")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = chromium(url, tmp_path, f"--screenshot={ARTIFACTS / 'dashboard.png'}", "--window-size=1280,1100")
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    for run in (first, second, shot):
        errors = [line for line in run.stderr.splitlines() if "CONSOLE" in line and
                  ("Uncaught" in line or "ERROR" in line or "Error" in line)]
        assert not errors, errors
    before, after = numbers(first.stdout), numbers(second.stdout)
    assert all(re.search(r'id="status"[^>]*>live<', run.stdout) for run in (first, second))
    assert before["steps"] != "-" and int(after["steps"]) > int(before["steps"]) > 0  # it moves
    assert before["kv"].endswith("%") and "/" in before["tree"]
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


def test_dashboard_data_is_json_and_takes_any_since(server):
    assert server.http.get("/dashboard/data").json()["samples"]
    for since in ("nan", "inf", "-1e308", "abc"):
        response = server.http.get("/dashboard/data", params={"since": since})
        assert response.status_code in (200, 400, 422), response.text
