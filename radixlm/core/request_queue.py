"""Waiting queues: the order in which waiting requests are offered to the scheduler."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from radixlm.request import Request


class WaitingQueue:
    """First come, first served; a preempted request goes back to the front (it was admitted before the rest)."""

    def __init__(self) -> None:
        self._requests: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._requests.append(request)

    def add_preempted(self, request: Request) -> None:
        self._requests.appendleft(request)

    def peek(self) -> Request:
        return self._requests[0]

    def remove(self, request: Request) -> None:
        self._requests.remove(request)

    def reorder(self, ordered: list[Request]) -> None:
        """Replace the order (used by cache-aware policies); `ordered` must hold exactly the same requests."""
        self._requests = deque(ordered)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)


class PriorityWaitingQueue(WaitingQueue):
    """Lower `priority` value first, then earlier arrival; a preempted request returns to its sorted place."""

    def __init__(self) -> None:
        super().__init__()
        self._sorted: list[Request] = []

    @staticmethod
    def _key(request: Request) -> tuple[int, int]:
        return (request.priority, request.arrival_order)

    def add(self, request: Request) -> None:
        bisect.insort(self._sorted, request, key=self._key)

    def add_preempted(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._sorted[0]

    def remove(self, request: Request) -> None:
        self._sorted.remove(request)

    def reorder(self, ordered: list[Request]) -> None:
        raise NotImplementedError("the priority queue keeps its own order")

    def __len__(self) -> int:
        return len(self._sorted)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._sorted)

    def __bool__(self) -> bool:
        return bool(self._sorted)
