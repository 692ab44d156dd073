"""Every response carries `X-Request-Id`: the client's own echoed back, or a generated one."""

from __future__ import annotations

import re

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_generated_when_absent_echoed_when_given(tiny_server):
    first = tiny_server.http.post("/v1/chat/completions", json=CHAT)
    second = tiny_server.http.post("/v1/chat/completions", json=CHAT)
    assert first.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", first.headers["x-request-id"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    own = tiny_server.http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "trace-42.a:b"})
    assert own.headers["x-request-id"] == "trace-42.a:b"


def test_errors_and_streams_carry_it_too(tiny_server):
    for response in (tiny_server.http.post("/v1/chat/completions", json={"messages": []}),
                     tiny_server.http.get("/v1/no-such-route"),
                     tiny_server.http.post("/v1/completions", content=b"{not json",
                                           headers={"Content-Type": "application/json"}),
                     tiny_server.http.get("/health")):
        assert response.status_code in (200, 400, 404) and response.headers["x-request-id"]
    with tiny_server.http.stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True},
                                 headers={"X-Request-Id": "s-1"}) as stream:
        assert stream.headers["x-request-id"] == "s-1"
        assert "[DONE]" in "".join(stream.iter_text())


def test_an_unsafe_id_is_replaced_not_reflected(tiny_server):
    for hostile in ("a" * 129, "two words", "<script>", "x;y"):
        response = tiny_server.http.get("/health", headers={"X-Request-Id": hostile})
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"]), hostile
