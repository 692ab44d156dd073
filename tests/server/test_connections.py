"""Connection-level behaviour behind a real uvicorn (in a thread): an error never poisons the keep-alive
connection, the API key is checked before the body is read, slow headers and slow bodies are cut off."""

from __future__ import annotations

import json
import socket
import time

import pytest

from radixlm.server.completions import Completions
from server.inprocess import ThreadedServer

API_KEY = "k"
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    server = ThreadedServer(tiny_model_dir("llama"), header_timeout=HEADER_TIMEOUT, api_key=API_KEY,
                            body_timeout=BODY_TIMEOUT)
    yield server
    server.close()


def raw_request(body: bytes | str, path: str = "/v1/completions", key: str | None = API_KEY) -> bytes:
    body = body.encode() if isinstance(body, str) else body
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length; b"" closes are an AssertionError."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def connect(server: ThreadedServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


GOOD = json.dumps({"prompt": "the quick", "max_tokens": 2, "temperature": 0})


def test_a_500_keeps_the_keep_alive_connection(server, monkeypatch):
    """Row: after any 500, the next request on the same keep-alive connection failed with ECONNRESET."""
    async def broken(self, *args):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(Completions, "_prompts", broken)
    with connect(server) as sock:
        sock.sendall(raw_request(GOOD))
        status, headers, body = read_response(sock)
        assert status == 500 and "injected bug" in json.loads(body)["error"]["message"]
        assert headers.get("connection") != "close"
        monkeypatch.undo()
        for _ in range(2):  # the same socket serves the next requests
            sock.sendall(raw_request(GOOD))
            status, _, body = read_response(sock)
            assert status == 200, body
        sock.sendall(raw_request('{"prompt": "\\ud800", "max_tokens": 2}'))  # a 400 too
        assert read_response(sock)[0] == 400
        sock.sendall(raw_request(GOOD))
        assert read_response(sock)[0] == 200


def test_api_key_is_checked_before_the_body_is_parsed(server):
    with connect(server) as sock:
        sock.sendall(raw_request("{not json", key=None))
        status, _, body = read_response(sock)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        sock.sendall(raw_request("{not json", key="wrong"))
        assert read_response(sock)[0] == 401
        sock.sendall(raw_request("{not json"))
        assert read_response(sock)[0] == 400  # with the key, the body is read (malformed JSON: 400, as OpenAI answers)


def test_slow_headers_are_cut_off(server):
    with connect(server) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
        closed = False
        for _ in range(int(4 * HEADER_TIMEOUT / 0.2)):
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if closed_within(sock, 0.2):
                closed = True
                break
        assert closed and time.monotonic() - start < 3 * HEADER_TIMEOUT + 1
    with connect(server) as idle:  # a connection that never sends a byte is closed too
        assert closed_within(idle, 3 * HEADER_TIMEOUT + 1)


def test_slow_body_gets_408(server):
    with connect(server) as sock:
        request = raw_request(GOOD)
        sock.sendall(request[:-10])  # headers and most of the body, never the rest
        start = time.monotonic()
        status, _, body = read_response(sock)
        assert status == 408 and "did not arrive" in json.loads(body)["error"]["message"]
        assert time.monotonic() - start < BODY_TIMEOUT + 2


def test_head_health_over_http(server):
    with connect(server) as sock:
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: test\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n")
