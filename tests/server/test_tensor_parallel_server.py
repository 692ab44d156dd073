"""`radixlm serve` with worker processes that die: the server fails its requests and exits within 10 s with a
message naming the process, whether a request is running or the server is idle."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil

from server.harness import REPO_ROOT, TEST_KV_BUDGET, free_port, start_server


def wait_exit(server, timeout: float) -> float:
    """Seconds until the server process exited (AssertionError after `timeout`)."""
    started = time.monotonic()
    while server.process.poll() is None:
        assert time.monotonic() - started < timeout, f"server still running after {timeout} s:\n{server.log()}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_killed_rank_fails_the_running_request_and_ends_the_server(long_model_dir, tmp_path):
    server = start_server(long_model_dir, tmp_path, "--tensor-parallel-size", "2", "--num-kv-blocks", "600",
                          "--block-size", "4")
    try:
        pid = int(re.search(r"tensor-parallel rank 1 started \(pid (\d+)\)", server.log_path.read_text()).group(1))
        replies: list[httpx.Response | BaseException] = []

        def complete() -> None:
            try:
                replies.append(server.http.post("/v1/completions", json={
                    "model": str(long_model_dir), "prompt": "hello", "max_tokens": 2000, "ignore_eos": True},
                    timeout=60))
            except BaseException as error:  # the connection may close as the server exits
                replies.append(error)

        request = threading.Thread(target=complete)
        request.start()
        server.wait_for(lambda m: m.get("radixlm:num_requests_running{}", 0) >= 1, what="a running request")
        psutil.Process(pid).send_signal(signal.SIGKILL)
        assert wait_exit(server, 10) < 10
        request.join(10)
        assert not request.is_alive(), "the request hung"
        reply = replies[0]
        assert isinstance(reply, BaseException) or reply.status_code >= 500, reply
        assert server.process.returncode == 1
        assert re.search(r"tensor-parallel rank 1 \(pid \d+\) exited with code -9", server.log()), server.log()
    finally:
        server.stop(signal.SIGKILL)


def test_killed_mp_worker_ends_an_idle_server(tiny_model_dir, tmp_path):
    server = start_server(tiny_model_dir("llama"), tmp_path, "--distributed-executor-backend", "mp")
    try:
        # The worker is forked from the server's forkserver (radixlm.worker.launch): the one grandchild.
        workers = [process for process in psutil.Process(server.process.pid).children(recursive=True)
                   if process.ppid() != server.process.pid]
        assert len(workers) == 1, workers
        workers[0].send_signal(signal.SIGKILL)
        assert wait_exit(server, 10) < 10
        assert server.process.returncode == 1
        assert re.search(r"the worker process \(pid \d+\) exited with code -9", server.log()), server.log()
    finally:
        server.stop(signal.SIGKILL)


def start_node1(model, flags: list[str], log_path) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--model", str(model),
                                 "--node-rank", "1", *flags], stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env=dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1"))


def two_node_flags() -> list[str]:
    return ["--tensor-parallel-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}",
            "--num-threads", "1", *TEST_KV_BUDGET]  # node 1 sizes its rank's cache itself


def test_a_rank_on_another_node_that_dies_ends_the_server(long_model_dir, tmp_path):
    """Node 0 cannot watch node 1's processes: the failed collective itself stops the engine (not a forward
    failure to retry), and the server exits within 10 s."""
    flags = two_node_flags()
    node1 = start_node1(long_model_dir, flags, tmp_path / "node1.log")
    try:
        server = start_server(long_model_dir, tmp_path, "--node-rank", "0", "--num-kv-blocks", "600",
                              "--block-size", "4", *flags)
        try:
            pid = int(re.search(r"tensor-parallel rank 1 started \(pid (\d+)\)",
                                (tmp_path / "node1.log").read_text()).group(1))
            with ThreadPoolExecutor(1) as pool:
                reply = pool.submit(server.http.post, "/v1/completions", json={
                    "model": str(long_model_dir), "prompt": "hello", "max_tokens": 2000, "ignore_eos": True},
                    timeout=60)
                server.wait_for(lambda m: m.get("radixlm:num_requests_running{}", 0) >= 1, what="a running request")
                psutil.Process(pid).send_signal(signal.SIGKILL)
                assert wait_exit(server, 10) < 10
                assert reply.result().status_code >= 500
            assert server.process.returncode == 1
            assert "the tensor-parallel group failed" in server.log(), server.log()
        finally:
            server.stop(signal.SIGKILL)
        assert node1.wait(timeout=10) == 1  # its rank died
    finally:
        if node1.poll() is None:
            node1.kill()


def test_two_nodes_on_localhost(tiny_model_dir, tmp_path):
    """Node 1 (`serve --node-rank 1`) runs rank 1 only and exits cleanly when node 0's server stops."""
    model = tiny_model_dir("llama")
    flags = two_node_flags()
    node1_log = tmp_path / "node1.log"
    node1 = start_node1(model, flags, node1_log)
    try:
        server = start_server(model, tmp_path, "--node-rank", "0", *flags)
        try:
            reply = server.http.post("/v1/completions", json={"model": str(model), "prompt": "hello",
                                                              "max_tokens": 5, "temperature": 0})
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 5
        finally:
            assert server.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
        assert node1.wait(timeout=20) == 0, node1_log.read_text()
    finally:
        if node1.poll() is None:
            node1.kill()
