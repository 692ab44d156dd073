"""The app's finished responses, for GET /v1/responses/{id} and `previous_response_id`: bounded in entries, in
bytes and in time.

Each entry keeps the Response body and the whole conversation up to and including its output, as Responses items
(what a continuation renders before its own input), as JSON text and sized by it. Entries leave oldest first:
past `max_entries` or `max_bytes`, and `ttl_seconds` after they were stored. A continuation's entry holds its
whole conversation, its predecessor's items included.
One store per app, used from the app's event loop only (no locking).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 128 * 2**20
DEFAULT_TTL_SECONDS = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    """Kept as JSON text, so that `num_bytes` is what the entry really holds (parsed JSON takes several times more
    memory than its text, and would make the byte bound a fraction of the truth)."""

    response_json: str  # the Response object, as GET returns it
    conversation_json: str  # input items, then output items, from the first response of the chain on
    expires_at: float

    @property
    def num_bytes(self) -> int:
        return len(self.response_json) + len(self.conversation_json)

    @property
    def response(self) -> dict[str, Any]:
        return json.loads(self.response_json)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        return json.loads(self.conversation_json)


class ResponseStore:
    """`put` / `get` / `delete` by response id; expired entries are dropped as they are met."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES,
                 ttl_seconds: float = DEFAULT_TTL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_seconds <= 0:
            raise ValueError("a response store needs room for an entry and a positive TTL")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self.num_bytes = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response_id: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> bool:
        """Keep the response, evicting the oldest entries to make room; False if it alone exceeds `max_bytes`
        (it is not kept)."""
        entry = StoredResponse(json.dumps(response), json.dumps(conversation), self._clock() + self.ttl_seconds)
        num_bytes = entry.num_bytes
        if num_bytes > self.max_bytes:
            return False
        self.delete(response_id)
        self._expire()
        while self._entries and (len(self._entries) >= self.max_entries or
                                 self.num_bytes + num_bytes > self.max_bytes):
            self._pop_oldest()
        self._entries[response_id] = entry
        self.num_bytes += num_bytes
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.num_bytes -= entry.num_bytes
        return True

    def _expire(self) -> None:
        """Drop expired entries: with one TTL for all, they are the oldest."""
        now = self._clock()
        while self._entries and next(iter(self._entries.values())).expires_at <= now:
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.num_bytes -= entry.num_bytes
