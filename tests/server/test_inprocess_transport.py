"""The in-process transports behave like a socket where tests rely on it: a chunked body arrives in its chunks,
requests from several threads run at once, and an app that never answers is a read timeout, not a hung test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from anyio.from_thread import start_blocking_portal

from server.inprocess import AsyncPortalTransport, PortalTransport


async def echo_app(scope, receive, send) -> None:
    """Answers with the body's chunk count and sizes; `/slow` first sleeps `?seconds=` (default: forever)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(float(scope["query_string"].decode().partition("=")[2] or "3600"))
    sizes = []
    while True:
        message = await receive()
        sizes.append(len(message.get("body", b"")))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": repr(sizes).encode()})


@pytest.fixture
def transport() -> Iterator[PortalTransport]:
    with start_blocking_portal() as portal:
        yield PortalTransport(portal, echo_app)


def test_a_chunked_body_arrives_in_its_chunks(transport):
    client = httpx.Client(transport=transport, base_url="http://app")
    assert client.post("/", content=(part for part in [b"ab", b"cde"])).text == "[2, 3, 0]"
    assert client.post("/", content=b"abc").text == "[3, 0]"  # (httpx ends with an empty message)


def test_requests_from_several_threads_run_at_once(transport):
    client = httpx.Client(transport=transport, base_url="http://app")
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: client.get("/slow", params={"seconds": 0.5}), range(4)))
    assert all(r.status_code == 200 for r in responses) and time.monotonic() - started < 1.5


def test_an_app_that_never_answers_is_a_read_timeout(transport):
    with pytest.raises(httpx.ReadTimeout):
        httpx.Client(transport=transport, base_url="http://app", timeout=0.2).get("/slow")

    async def ask() -> None:
        async with httpx.AsyncClient(transport=AsyncPortalTransport(transport), base_url="http://app",
                                     timeout=0.2) as client:
            assert (await client.get("/")).status_code == 200
            await client.get("/slow")

    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(ask())
