"""`X-Request-Id` on every response: the client's own id echoed back, or one generated for it (as vLLM and most
proxies do), so that a client, a proxy and the server's log can name the same request."""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
# Echoed only when it is a plain token: a client's header goes back out, so nothing that could split or smuggle
# a header (or fill a log) is reflected.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def request_id_of(scope: Scope) -> str:
    """The id a request goes by: its own `X-Request-Id` when that is safe to echo, else a new one."""
    for name, value in scope.get("headers", ()):
        if name == HEADER.encode():
            text = value.decode("latin-1")
            return text if _SAFE_ID.fullmatch(text) else uuid.uuid4().hex
    return uuid.uuid4().hex


class RequestIdHeader:
    """ASGI middleware: every HTTP response carries `X-Request-Id`; the id is in `scope["state"]["request_id"]`
    for handlers that want it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
