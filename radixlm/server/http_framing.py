"""Strict request framing for h11: a request head that two HTTP parsers could frame differently is refused.

Request smuggling needs a front proxy and this server to disagree on where a request's body ends; whatever
the body holds past the server's idea of its end is then read as a second request that the proxy never saw.
h11 0.16 already refuses most ambiguous framing: conflicting Content-Length values (`5, 6`, or two headers),
any Transfer-Encoding but exactly `chunked` (`chunked, identity`, `xchunked`, the header twice), a Content-Length
that is not plain digits, whitespace between a field name and its colon. What it accepts and resolves on its own,
as RFC 9112 lets a recipient do, is refused here too, since a proxy may have resolved it otherwise:

- Content-Length together with Transfer-Encoding (h11 reads the body as chunked; RFC 9112 §6.1 lets a server
  refuse it, and requires the connection closed after answering in any case);
- Transfer-Encoding in an HTTP/1.0 request (§6.1: the framing is to be treated as faulty);
- a repeated Content-Length, even with equal values (`5, 5`, or two headers; h11 merges them, RFC 9110 §8.6);
- obs-fold, a header line continued on the next (h11 unfolds it; §5.2 lets a server answer 400 instead);
- a bare LF ending a line of the head (h11 takes it for CRLF; §2.2 allows either).

The protocol answers any refusal, h11's or these, with a 400 and closes the connection (`http_protocol.py`).
"""

from __future__ import annotations

import re
from typing import Any

import h11

_BARE_LF = re.compile(rb"(?<!\r)\n")
MAX_MESSAGE_CHARS = 200  # h11 quotes the offending line; a client's header goes no further than this into a reply


def framing_problem(head: bytes) -> str | None:
    """Why a request head h11 has accepted is still ambiguous to frame, or None if it is not.

    `head` is the request's bytes from its request line through the blank line that ends its fields."""
    if _BARE_LF.search(head):
        return "a line of the request head ends in a bare LF; HTTP/1.1 lines end in CRLF"
    request_line, *lines = head.split(b"\r\n")
    fields = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            return "obsolete line folding (a header continued on the next line) is not accepted"
        if line:
            name, _, value = line.partition(b":")
            fields.append((name.lower(), value))
    lengths = [value for name, value in fields if name == b"content-length"]
    chunked = any(name == b"transfer-encoding" for name, _ in fields)
    if lengths and chunked:
        return "the request has both Content-Length and Transfer-Encoding; send only one"
    if len(lengths) > 1 or any(b"," in value for value in lengths):
        return "the request has more than one Content-Length"
    if chunked and request_line.endswith(b"HTTP/1.0"):
        return "Transfer-Encoding is not defined in HTTP/1.0"
    return None


class StrictFramingConnection(h11.Connection):
    """An h11 server connection that also refuses what `framing_problem` names, by raising
    `h11.RemoteProtocolError` from `next_event` as h11 does for its own refusals; after a refusal every
    `next_event` raises, so nothing behind the refused request is read. `refusal` is the last refusal's message,
    h11's or ours, for the 400 that answers it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(h11.SERVER, *args, **kwargs)
        self.refusal: str | None = None

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        if self.refusal is not None:
            raise h11.RemoteProtocolError(self.refusal)
        # The head is what h11 consumes from the buffer when it yields the Request: bytes, not its parsed
        # headers, since h11 has already merged repeated lengths and unfolded lines by then.
        before = self.trailing_data[0] if self.their_state is h11.IDLE else None
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as error:
            self.refusal = str(error)[:MAX_MESSAGE_CHARS]
            raise
        if before is not None and isinstance(event, h11.Request):
            problem = framing_problem(before[:len(before) - len(self.trailing_data[0])])
            if problem is not None:
                self.refusal = problem
                raise h11.RemoteProtocolError(problem)
        return event
