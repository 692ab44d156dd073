"""Request framing that two HTTP parsers could read differently (request smuggling) is refused by a real
`radixlm serve`: a 400 in OpenAI's shape with `Connection: close`, then the server closes the socket, so nothing
sent after the ambiguous request (a smuggled second request) is answered. RFC 9112 §6.1, §5.2, §2.2."""

from __future__ import annotations

import json
import socket
import time

import pytest

QUIET = 2.0  # seconds without a byte after which a connection that has not closed counts as kept open
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n"
BODY = b'{"prompt": "the quick", "max_tokens": 1}'


@pytest.fixture(scope="module")
def server(default_tool_server):
    return default_tool_server  # a real `radixlm serve` process (one start less for the suite)


def post(headers: list[str], body: bytes, version: str = "HTTP/1.1", eol: str = "\r\n") -> bytes:
    lines = [f"POST /v1/completions {version}", "Host: test", "Content-Type: application/json", *headers]
    return (eol.join(lines) + eol + eol).encode() + body


def exchange(port: int, request: bytes) -> tuple[list[tuple[int, dict[str, str], bytes]], bool]:
    """Send `request` (with `SMUGGLED` behind it) on a fresh connection; the responses read until the server
    closes it or goes quiet for `QUIET` seconds, and whether it closed."""
    data, closed = b"", False
    with socket.create_connection(("127.0.0.1", port), timeout=QUIET) as sock:
        sock.sendall(request + SMUGGLED)
        try:
            while chunk := sock.recv(65536):
                data += chunk
            closed = True
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed = True
    return parse(data), closed


def parse(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Back-to-back responses, each framed by its Content-Length (all of this server's are)."""
    responses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", len(rest)))
        responses.append((int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return responses


def assert_refused(server, request: bytes) -> None:
    responses, closed = exchange(server.port, request)
    assert [status for status, _, _ in responses] == [400], responses  # the smuggled GET is not answered
    _, headers, body = responses[0]
    assert headers.get("connection") == "close" and headers.get("content-type") == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert closed, "the server kept the connection open after refusing its framing"
    assert_still_serving(server)


def assert_still_serving(server) -> None:
    responses, _ = exchange(server.port, post([f"Content-Length: {len(BODY)}", "Connection: close"], BODY))
    assert responses[0][0] == 200, responses


CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


def test_content_length_and_chunked_is_refused_and_closed(server):
    """The probe's row: chunked framing ends the body early, the Content-Length span holds a second request."""
    span = CHUNKED + SMUGGLED
    assert_refused(server, post([f"Content-Length: {len(span)}", "Transfer-Encoding: chunked"], CHUNKED))
    assert_refused(server, post(["Transfer-Encoding: chunked", f"Content-Length: {len(span)}"], CHUNKED))


def test_transfer_encoding_in_http_1_0_is_refused(server):
    assert_refused(server, post(["Transfer-Encoding: chunked"], CHUNKED, version="HTTP/1.0"))


@pytest.mark.parametrize("headers", [
    [f"Content-Length: {len(BODY)}, {len(BODY)}"],
    [f"Content-Length: {len(BODY)}", f"Content-Length: {len(BODY)}"],
], ids=["repeated-in-one-header", "two-equal-headers"])
def test_repeated_content_length_is_refused(server, headers):
    """h11 merges equal values; RFC 9110 §8.6 lets a recipient refuse them instead, as a proxy may read them
    differently."""
    assert_refused(server, post(headers, BODY))


def test_obsolete_line_folding_is_refused(server):
    """h11 unfolds it (RFC 9112 §5.2 allows either); a proxy that does not would see a different header."""
    assert_refused(server, post(["X-Note: first", " Transfer-Encoding: chunked", f"Content-Length: {len(BODY)}"],
                                BODY))


def test_bare_lf_line_ends_are_refused(server):
    assert_refused(server, post([f"Content-Length: {len(BODY)}"], BODY, eol="\n"))
    assert_refused(server, post([f"X-Note: a\nTransfer-Encoding: chunked\r\nContent-Length: {len(CHUNKED)}"],
                                CHUNKED))


@pytest.mark.parametrize("headers", [
    [f"Content-Length: {len(BODY)}, {len(BODY) + 1}"],
    [f"Content-Length: {len(BODY)}", f"Content-Length: {len(BODY) + 1}"],
    ["Transfer-Encoding: chunked, identity"],
    ["Transfer-Encoding: xchunked"],
    ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
    [f"Content-Length : {len(BODY)}"],
    [f"Content-Length: +{len(BODY)}"],
], ids=["conflicting-list", "conflicting-headers", "te-list", "te-unknown", "te-twice", "space-before-colon",
        "signed-length"])
def test_what_h11_refuses_gets_the_same_answer(server, headers):
    """h11 refuses these itself; the answer is the same OpenAI-shaped 400 and close."""
    assert_refused(server, post(headers, BODY))


def test_keep_alive_still_works(server):
    """The checks leave well-framed requests alone: several on one connection, chunked and not."""
    plain = post([f"Content-Length: {len(BODY)}"], BODY)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(plain + post(["Transfer-Encoding: chunked"], CHUNKED) + plain)
        data, deadline = b"", time.monotonic() + 30
        while data.count(b"HTTP/1.1 200 ") < 3 and time.monotonic() < deadline:
            data += sock.recv(65536)
        assert data.count(b"HTTP/1.1 200 ") == 3, data
