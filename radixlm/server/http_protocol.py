"""uvicorn's h11 protocol with a deadline on request headers (slowloris) and strict request framing.

uvicorn closes a keep-alive connection that stays idle for `timeout_keep_alive` seconds, but any byte restarts
nothing: its timer is simply cancelled by incoming data, and a new connection has no timer at all. So a client
sending one header byte every few seconds holds a connection (and a file descriptor) forever. Here a connection
must deliver a request's complete headers within `header_timeout` seconds of being opened or of its previous
response ending, else it is closed. Bodies are bounded by `middleware.BodyReadTimeout`.

A request whose framing is ambiguous (`http_framing.py`: request smuggling) or that h11 cannot parse is answered
with a 400 in OpenAI's shape and `Connection: close`, then the connection is closed, as uvicorn closes it after
its own plain-text 400: nothing pipelined behind such a request is read.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE  # uvicorn's default too
from uvicorn.protocols.http.h11_impl import H11Protocol

from radixlm.server.errors import APIError
from radixlm.server.http_framing import StrictFramingConnection

DEFAULT_HEADER_TIMEOUT = 10.0


class HeaderTimeoutH11Protocol(H11Protocol):
    """Pass `with_header_timeout(seconds)` as uvicorn's `http` protocol class."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    _header_deadline: asyncio.TimerHandle | None = None
    _cycle_when_armed: object = None

    @classmethod
    def with_header_timeout(cls, seconds: float) -> type[HeaderTimeoutH11Protocol]:
        return type(cls.__name__, (cls,), {"header_timeout": seconds})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        max_head = self.config.h11_max_incomplete_event_size
        self.conn = StrictFramingConnection(DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if max_head is None else max_head)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_deadline is not None and self.cycle is not self._cycle_when_armed:
            self._cancel_header_deadline()  # a new request cycle began: its headers are complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 (or `http_framing`) refuses: here a 400 in OpenAI's shape naming the
        reason, then the connection closes."""
        # IDLE: h11 refused the head itself (it lets a server answer that with a Response); SEND_RESPONSE: the head
        # parsed, then `http_framing` refused it. Anything else: a response is already under way, no room for a 400.
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.close()
            return
        message = getattr(self.conn, "refusal", None) or msg
        body = json.dumps(APIError(400, f"invalid HTTP request: {message}", code="invalid_http_request").body())
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body.encode()), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        if self.transport.is_closing():
            return
        self._cycle_when_armed = self.cycle
        self._header_deadline = self.loop.call_later(self.header_timeout, self._on_header_deadline)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _on_header_deadline(self) -> None:
        self._header_deadline = None
        if self.cycle is self._cycle_when_armed:  # still waiting for the headers of the next request
            self.timeout_keep_alive_handler()
