"""OutputStream: the outputs of a group of engine requests, handed from the engine thread to the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from radixlm.outputs import RequestOutput


class OutputStream:
    """The outputs of a group of engine requests, as `(prompt index, RequestOutput)`, in step order.

    Iterate it from the event loop; `abort()` (idempotent) aborts the requests that have not finished. A consumer
    that stops early must call `abort()`, or the requests keep their KV blocks until they finish.
    """

    def __init__(self, abort: Callable[[list[str]], None], request_ids: list[str]) -> None:
        """`abort(request_ids)`: the engine's (thread-safe)."""
        self.request_ids = request_ids
        self._abort = abort
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._prompt_index = {request_id: i for i, request_id in enumerate(request_ids)}
        self._unfinished = set(request_ids)

    def abort(self) -> None:
        if self._unfinished:
            self._abort(sorted(self._unfinished))
            self._unfinished.clear()

    def put(self, item: RequestOutput | BaseException) -> None:
        """Event-loop side of the hand-off (called through call_soon_threadsafe)."""
        self._queue.put_nowait(item)

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        while self._unfinished or not self._queue.empty():
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self._unfinished.clear()
                raise item
            if item.finished:
                self._unfinished.discard(item.request_id)
            return self._prompt_index[item.request_id], item
        raise StopAsyncIteration
