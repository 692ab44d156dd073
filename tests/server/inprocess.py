"""The app in this process: `InProcessApp` over httpx's ASGI transport (no sockets), `ThreadedServer` behind a
real uvicorn on a loopback port (for connection-level behaviour: keep-alive, slow clients). Both run the app's
lifespan, so the engine thread is real, and let tests patch code the app runs."""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from anyio.from_thread import start_blocking_portal

from radixlm.engine.llm_engine import build_engine
from radixlm.server.api_server import create_app
from radixlm.server.http_protocol import HeaderTimeoutH11Protocol
from server.harness import free_port

MODEL_NAME = "tiny"
ENGINE_OPTIONS = {"num_kv_blocks": 256, "block_size": 4, "num_threads": 1}


def tiny_app(model_dir: Path, engine_options: dict[str, Any] | None = None, **app_options: Any):
    options = ENGINE_OPTIONS | (engine_options or {})
    return create_app(lambda: build_engine(model=str(model_dir), **options), MODEL_NAME, **app_options)


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


class ThreadedServer:
    """uvicorn (our h11 protocol with its header deadline) serving the app on a free loopback port."""

    def __init__(self, model_dir: Path, header_timeout: float = 10.0, **app_options: Any) -> None:
        self.port = free_port()
        self.app = tiny_app(model_dir, **app_options)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                http=HeaderTimeoutH11Protocol.with_header_timeout(header_timeout))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        with httpx.Client(base_url=self.base_url) as client:
            wait_healthy(client.get)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.app.state.async_engine.shutdown()
        self.server.should_exit = True
        self.thread.join(30)
