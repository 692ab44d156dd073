"""Pure ASGI middleware around the app: the last-resort 500, the API key check, the body read deadline.

Pure ASGI (not FastAPI dependencies or `@app.middleware`) so that each acts before FastAPI reads or parses the
body, and so that none of them can break the connection: a response that was answered in full keeps the client's
keep-alive connection usable.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlm.background_threads import release_free_memory
from radixlm.server.errors import APIError, error_response

logger = logging.getLogger(__name__)


class ErrorBoundary:
    """An unexpected exception becomes a 500 in OpenAI's shape (Anthropic's on its paths), and goes no further.

    Why not `app.add_exception_handler(Exception, ...)`: Starlette sends that handler's response and then raises
    the exception again (for servers to log it), and uvicorn answers an exception from the app by closing the
    connection, so the client's next request on that keep-alive connection failed with ECONNRESET. Here the error
    is logged and swallowed once a response has been sent in full; an exception in the middle of a response
    (nothing valid can follow it) still propagates, and the server closes that connection.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = {"started": False, "complete": False}

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as error:
            logger.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if state["complete"]:
                return
            if state["started"]:
                raise
            message = f"internal server error: {type(error).__name__}: {error}"
            internal = APIError(500, message.encode("utf-8", "backslashreplace").decode("utf-8"))
            await error_response(scope["path"], internal)(scope, receive, send)


class APIKeyCheck:
    """401 for a request to a protected path without the key, before its body is read. The key comes as
    `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's)."""

    def __init__(self, app: ASGIApp, api_key: str | None, protected_prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key is not None else None
        self.protected_prefixes = protected_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_key is None or scope["type"] != "http" or not scope["path"].startswith(self.protected_prefixes):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        bearer_ok = scheme.lower() == "bearer" and secrets.compare_digest(credentials.strip().encode(), self.api_key)
        x_api_key = headers.get("x-api-key")
        x_api_key_ok = x_api_key is not None and secrets.compare_digest(x_api_key.strip().encode(), self.api_key)
        if not (bearer_ok or x_api_key_ok):
            error = APIError(401, "invalid or missing API key (send Authorization: Bearer <key> or x-api-key: <key>)",
                             code="invalid_api_key")
            await error_response(scope["path"], error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyReadTimeout:
    """408 when a request's body has not fully arrived `seconds` after the request began (slow-body clients).

    uvicorn bounds idle keep-alive connections (`timeout_keep_alive`) and `http_protocol.py` bounds the headers;
    nothing else bounds a body sent one byte at a time. The deadline covers the body only: once it is complete,
    `receive()` waits as long as it needs (the server waits on it to notice a client that disconnects).
    """

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.seconds
        body_done = False

        async def receive_before_deadline() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {self.seconds:g} s") from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, receive_before_deadline, send)


class ReleaseMemoryAfterBigBodies:
    """ASGI middleware: once a request whose body held at least `min_bytes` is answered, the heap's free pages go
    back to the system (`background_threads.release_free_memory`, on a worker thread, one at a time).

    Parsing a 12 MB body makes a few hundred MB of short-lived Python objects; freed, they stay in the allocator
    (the model runner asks glibc to keep freed memory for its prefills), so without this a burst of big bodies
    leaves the server's RSS that much higher for good."""

    def __init__(self, app: ASGIApp, min_bytes: int = 4 * 2**20) -> None:
        self.app = app
        self.min_bytes = min_bytes
        self._releasing = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counting_receive, send)
        finally:
            if received >= self.min_bytes and not self._releasing:
                self._releasing = True
                try:
                    await asyncio.to_thread(release_free_memory)
                finally:
                    self._releasing = False
