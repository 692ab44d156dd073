"""The app in this process: `InProcessApp` over httpx's ASGI transport (no sockets), `InProcessServer` the same
app behind `ServerAccess` (what a `radixlm serve` subprocess offers tests: raw httpx, openai clients, metrics),
`ThreadedServer` behind a real uvicorn on a loopback port (for connection-level behaviour: keep-alive, slow
clients, and for clients that need a URL: bench serve, a browser). All run the app's lifespan, so the engine
thread is real, and let tests patch code the app runs.

Over the ASGI transport a response arrives once the app has sent all of it: a stream is read whole and a client
cannot disconnect mid-stream. Tests of disconnects, signals and exit codes keep a real server (harness.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from anyio.from_thread import BlockingPortal, start_blocking_portal
from starlette.types import ASGIApp

from radixlm.data_parallel.engine import replica_engine_options
from radixlm.engine.llm_engine import build_engine
from radixlm.server.api_server import create_app
from radixlm.server.http_protocol import HeaderTimeoutH11Protocol
from server.harness import ServerAccess, free_port

MODEL_NAME = "tiny"
ENGINE_OPTIONS = {"num_kv_blocks": 256, "block_size": 4, "num_threads": 1}


def tiny_app(model_dir: Path, engine_options: dict[str, Any] | None = None, model_name: str = MODEL_NAME,
             **app_options: Any):
    options = ENGINE_OPTIONS | (engine_options or {})
    num_replicas = int(options.get("data_parallel_size", 1))
    if num_replicas > 1:  # as `radixlm serve --data-parallel-size N` builds them
        factories = [partial(build_engine, model=str(model_dir), **replica_engine_options(options, i))
                     for i in range(num_replicas)]
        return create_app(factories, model_name, **app_options)
    return create_app(lambda: build_engine(model=str(model_dir), **options), model_name, **app_options)


def wait_healthy(get, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if get("/health").status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError("the app did not become healthy")


class InProcessApp:
    """`request(method, path, **httpx_kwargs)` from synchronous tests; the app lives on a portal thread's loop."""

    def __init__(self, model_dir: Path, engine_options: dict[str, Any] | None = None, **app_options: Any) -> None:
        self.app = tiny_app(model_dir, engine_options, **app_options)
        self._stack = contextlib.ExitStack()
        self.portal = self._stack.enter_context(start_blocking_portal())
        self._stack.enter_context(self.portal.wrap_async_context_manager(self.app.router.lifespan_context(self.app)))
        self.client = self.portal.call(self._client)
        self._stack.callback(lambda: self.portal.call(self.client.aclose))
        wait_healthy(lambda path: self.request("GET", path))

    async def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://app", timeout=120)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.portal.call(partial(self.client.request, method, path, **kwargs))

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, json=body, **kwargs)

    def close(self) -> None:
        self._stack.close()


class _Chunks(httpx.AsyncByteStream):
    """A request body already read, in the chunks it was sent in (a chunked upload stays chunked)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def read_timeout(request: httpx.Request) -> float | None:
    """The client's read timeout, here a deadline for the whole response (which arrives in one piece)."""
    return request.extensions.get("timeout", {}).get("read")


class PortalTransport(httpx.BaseTransport):
    """A synchronous httpx transport into an app living on a portal's event loop: each request runs there through
    httpx's ASGI transport, so requests from several threads run concurrently, as they would against a server."""

    def __init__(self, portal: BlockingPortal, app: ASGIApp) -> None:
        self.portal = portal
        self.asgi = httpx.ASGITransport(app=app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.stream = _Chunks(list(request.stream))
        future = self.portal.start_task_soon(self.send, request)
        done, _ = concurrent.futures.wait([future], timeout=read_timeout(request))
        if not done:  # a hung app fails the test, as a socket's read timeout would
            future.cancel()
            raise httpx.ReadTimeout("no response within the read timeout", request=request)
        return future.result()

    async def send(self, request: httpx.Request) -> httpx.Response:
        """On the portal's loop: the app's response, its body read (still encoded, as off a socket)."""
        response = await self.asgi.handle_async_request(request)
        body = b"".join([part async for part in response.stream])
        return httpx.Response(response.status_code, headers=response.headers, stream=httpx.ByteStream(body))


class AsyncPortalTransport(httpx.AsyncBaseTransport):
    """`PortalTransport` for async clients on another event loop (an `asyncio.run` in the test's thread)."""

    def __init__(self, sync: PortalTransport) -> None:
        self.sync = sync

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.stream = _Chunks([chunk async for chunk in request.stream])
        # cancelling the wait (the caller's or the timeout's) cancels the request's task on the app's loop
        response = asyncio.wrap_future(self.sync.portal.start_task_soon(self.sync.send, request))
        done, _ = await asyncio.wait({response}, timeout=read_timeout(request))
        if not done:
            response.cancel()
            raise httpx.ReadTimeout("no response within the read timeout", request=request)
        return response.result()


class InProcessServer(ServerAccess):
    """`radixlm serve --model MODEL_DIR` with the same engine and app options, in this process and reached over
    the ASGI transport; the model's name is its directory, as the CLI names it."""

    base_url = "http://app"

    def __init__(self, model_dir: Path, engine_options: dict[str, Any] | None = None, api_key: str | None = None,
                 **app_options: Any) -> None:
        self.api_key = api_key
        self.app = InProcessApp(model_dir, engine_options, model_name=str(model_dir), model_path=str(model_dir),
                                api_key=api_key, **app_options)
        self.transport = PortalTransport(self.app.portal, self.app.app)
        self.http = self.http_client()

    def sync_transport(self) -> httpx.BaseTransport:
        return self.transport

    def async_transport(self) -> httpx.AsyncBaseTransport:
        return AsyncPortalTransport(self.transport)

    def stop(self) -> None:
        self.http.close()
        self.app.close()


class ThreadedServer(ServerAccess):
    """uvicorn (our h11 protocol with its header deadline) serving the app on a free loopback port from a thread:
    a real socket (keep-alive, slow clients, disconnects, clients that need a URL) without a subprocess's start.
    The model is named by its directory, as the CLI names it."""

    def __init__(self, model_dir: Path, header_timeout: float = 10.0, engine_options: dict[str, Any] | None = None,
                 **app_options: Any) -> None:
        self.port = free_port()
        self.api_key = app_options.get("api_key")
        app_options = {"model_name": str(model_dir), "model_path": str(model_dir)} | app_options
        self.app = tiny_app(model_dir, engine_options, **app_options)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                http=HeaderTimeoutH11Protocol.with_header_timeout(header_timeout))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.http = self.http_client()
        wait_healthy(self.http.get)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.http.close()
        self.app.state.async_engine.shutdown()
        self.server.should_exit = True
        self.thread.join(30)

    stop = close
