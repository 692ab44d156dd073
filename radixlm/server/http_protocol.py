"""uvicorn's h11 protocol with a deadline on request headers (slowloris).

uvicorn closes a keep-alive connection that stays idle for `timeout_keep_alive` seconds, but any byte restarts
nothing: its timer is simply cancelled by incoming data, and a new connection has no timer at all. So a client
sending one header byte every few seconds holds a connection (and a file descriptor) forever. Here a connection
must deliver a request's complete headers within `header_timeout` seconds of being opened or of its previous
response ending, else it is closed. Bodies are bounded by `middleware.BodyReadTimeout`.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT = 10.0


class HeaderTimeoutH11Protocol(H11Protocol):
    """Pass `with_header_timeout(seconds)` as uvicorn's `http` protocol class."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    _header_deadline: asyncio.TimerHandle | None = None
    _cycle_when_armed: object = None

    @classmethod
    def with_header_timeout(cls, seconds: float) -> type[HeaderTimeoutH11Protocol]:
        return type(cls.__name__, (cls,), {"header_timeout": seconds})

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
