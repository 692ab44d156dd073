"""The attack phase of `radixlm bench soak --hostile`: the attacks of `soak_hostile` at a small concurrency, while
a thread of its own sends tiny requests on fresh connections at a steady pace and times them.

The tiny requests run on their own event loop in their own thread, started on a schedule (not one after another),
so a stalled server shows up as long latencies rather than as fewer samples, and the attacks' big uploads on the
main loop do not delay the timer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from radixlm.bench.soak_hostile import (
    KIND_FRAMING,
    KIND_SCHEMA,
    KIND_TOOL_SCHEMA,
    HostileRequest,
    build_attacks,
    classify_framing,
    parse_responses,
    tiny_requests,
)

FRAMING_QUIET = 2.0  # seconds without a byte after which a socket the server has not closed counts as kept open
FRAMING_FIRST_BYTE = 30.0  # seconds a framing attack waits for the first byte of an answer
TINY_TIMEOUT = 60.0  # a tiny request unanswered this long counts with this latency (it fails the p99 anyway)
MAX_TINY_IN_FLIGHT = 64  # a server that answers nothing must not make the trickle open sockets without end


@dataclass(frozen=True)
class HostileOptions:
    """`num_each` attacks of every kind, `concurrency` at a time; a tiny request every `tiny_interval` s."""

    num_each: int = 4
    concurrency: int = 4
    tiny_interval: float = 0.075


@dataclass
class HostileTally:
    """What the attack phase saw: status counts per kind ("dropped" for a connection the server broke), framing
    outcomes, latencies per kind and of the tiny requests."""

    statuses: dict[str, Counter[str]] = field(default_factory=dict)
    framing_outcomes: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    tiny_latencies: list[float] = field(default_factory=list)
    tiny_route_latencies: dict[str, list[float]] = field(default_factory=dict)
    num_5xx: int = 0
    num_dropped: int = 0
    num_unexpected: int = 0  # a status the kind does not allow, or a framing outcome other than "refused"
    problems: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        if len(self.problems) < 10:
            self.problems.append(problem)

    def record(self, kind: str, status: int | None, allowed: frozenset[int], seconds: float, detail: str) -> None:
        """One answer of `kind` (`status` None: the connection was dropped)."""
        self.statuses.setdefault(kind, Counter())["dropped" if status is None else str(status)] += 1
        if status is None:
            self.num_dropped += 1
            self.note(f"{kind}: dropped ({detail})")
            return
        self.latencies.setdefault(kind, []).append(seconds)
        if status >= 500:
            self.num_5xx += 1
            self.note(f"{kind}: {status} {detail}")
        elif status not in allowed:
            self.num_unexpected += 1
            self.note(f"{kind}: unexpected {status} {detail}")

    @property
    def num_smuggled(self) -> int:
        return self.framing_outcomes["smuggled"]


async def send_attack(http: httpx.AsyncClient, attack: HostileRequest, tally: HostileTally) -> None:
    started = time.perf_counter()
    try:
        response = await http.post(attack.route, content=attack.body, headers={"Content-Type": "application/json"})
    except httpx.TransportError as error:
        tally.record(attack.kind, None, attack.allowed, 0.0, f"{type(error).__name__}: {error}")
        return
    tally.record(attack.kind, response.status_code, attack.allowed, time.perf_counter() - started,
                 response.text[:160])


def exchange_raw(host: str, port: int, request: bytes, quiet: float = FRAMING_QUIET,
                 first_byte: float = FRAMING_FIRST_BYTE) -> tuple[bytes, bool]:
    """Send `request` on a fresh socket; everything read until the server closes it (True) or goes quiet (False):
    no byte within `first_byte` seconds, or none for `quiet` seconds after the first."""
    data = b""
    # A server slowed down by the other attacks may take a while to answer; once it has, a right one closes at once.
    with socket.create_connection((host, port), timeout=first_byte) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):
                data += chunk
                sock.settimeout(quiet)
        except TimeoutError:
            return data, False
        except ConnectionResetError:
            pass
    return data, True


async def send_framing(base_url: str, attack: HostileRequest, tally: HostileTally) -> None:
    url = httpx.URL(base_url)
    started = time.perf_counter()
    try:
        data, closed = await asyncio.to_thread(exchange_raw, url.host, url.port or 80, attack.body)
        responses = parse_responses(data)
    except (OSError, ValueError) as error:
        tally.framing_outcomes[f"error: {type(error).__name__}"] += 1
        tally.record(KIND_FRAMING, None, attack.allowed, 0.0, f"{type(error).__name__}: {error}")
        return
    outcome = classify_framing(responses, closed)
    tally.framing_outcomes[outcome] += 1
    statuses = [status for status, _, _ in responses]
    for status in statuses:  # only a 5xx counts here; whether the framing was refused is the outcome's to say
        tally.record(KIND_FRAMING, status, attack.allowed, time.perf_counter() - started, f"framing: {outcome}")
    if outcome != "refused":
        tally.num_unexpected += 1
        tally.note(f"framing: {outcome} (statuses {statuses}, closed={closed})")


class TinyTrickle:
    """A thread that sends `tiny_requests()` in turn, one every `interval` seconds on a fresh connection, until
    `stop()`; `latencies` and the status counts are read after `stop()` returns."""

    def __init__(self, base_url: str, interval: float) -> None:
        self.base_url = base_url
        self.interval = interval
        self.latencies: list[float] = []
        self.route_latencies: dict[str, list[float]] = {}
        self.statuses: Counter[str] = Counter()
        self.problems: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="soak-tiny", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    async def _run(self) -> None:
        # No keep-alive: each tiny request opens its own connection, as a new client would.
        limits = httpx.Limits(max_keepalive_connections=0, max_connections=MAX_TINY_IN_FLIGHT)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=TINY_TIMEOUT, limits=limits) as http:
            tasks: set[asyncio.Task[None]] = set()
            requests = tiny_requests()
            next_start = time.perf_counter()
            index = 0
            while not self._stopping.is_set():
                if len(tasks) < MAX_TINY_IN_FLIGHT:
                    route, body = requests[index % len(requests)]
                    task = asyncio.create_task(self._one(http, route, body))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    index += 1
                next_start += self.interval
                await asyncio.sleep(max(0.0, next_start - time.perf_counter()))
            await asyncio.gather(*tasks)

    async def _one(self, http: httpx.AsyncClient, route: str, body: bytes) -> None:
        started = time.perf_counter()
        try:
            response = await http.post(route, content=body, headers={"Content-Type": "application/json"})
        except httpx.TimeoutException:
            self._timed(route, TINY_TIMEOUT)
            self.statuses["timeout"] += 1
            return
        except httpx.TransportError as error:
            self.statuses["dropped"] += 1
            if len(self.problems) < 5:
                self.problems.append(f"tiny {route}: {type(error).__name__}: {error}")
            return
        self._timed(route, time.perf_counter() - started)
        self.statuses[str(response.status_code)] += 1
        if response.status_code != 200 and len(self.problems) < 5:
            self.problems.append(f"tiny {route}: {response.status_code} {response.text[:160]}")

    def _timed(self, route: str, seconds: float) -> None:
        self.latencies.append(seconds)
        self.route_latencies.setdefault(route, []).append(seconds)


def fold_tiny(trickle: TinyTrickle, tally: HostileTally) -> None:
    """The trickle's results into the tally: its latencies, and any non-200 as a 5xx, a drop or unexpected."""
    tally.tiny_latencies = list(trickle.latencies)
    tally.tiny_route_latencies = {route: list(values) for route, values in trickle.route_latencies.items()}
    tally.statuses["tiny"] = Counter(trickle.statuses)
    for status, count in trickle.statuses.items():
        if status == "dropped":
            tally.num_dropped += count
        elif status.isdigit() and int(status) >= 500:
            tally.num_5xx += count
        elif status != "200":
            tally.num_unexpected += count
    for problem in trickle.problems:
        tally.note(problem)


async def run_attacks(base_url: str, attacks: list[HostileRequest], options: HostileOptions,
                      tally: HostileTally) -> float:
    """Every attack, `options.concurrency` at a time, with the tiny trickle running throughout; the seconds the
    phase took."""
    trickle = TinyTrickle(base_url, options.tiny_interval)
    limit = asyncio.Semaphore(options.concurrency)
    started = time.perf_counter()
    trickle.start()
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                     limits=httpx.Limits(max_connections=options.concurrency + 2)) as http:

            async def one(attack: HostileRequest) -> None:
                async with limit:
                    if attack.kind == KIND_FRAMING:
                        await send_framing(base_url, attack, tally)
                    else:
                        await send_attack(http, attack, tally)

            await asyncio.gather(*(one(attack) for attack in attacks))
    finally:
        await asyncio.to_thread(trickle.stop)
    fold_tiny(trickle, tally)
    return time.perf_counter() - started


def warm_up_attacks(seed: int) -> list[HostileRequest]:
    """One attack of each kind that holds no state in a healthy server (framing, the big bodies): the server's
    first 12 MB body grows its heap once, which the RSS rule should not count as a leak. The schemas are left
    out: what they hold is the grammar cache, which the RSS rule allows for by its budget."""
    return [a for a in build_attacks(1, seed) if a.kind not in (KIND_SCHEMA, KIND_TOOL_SCHEMA)]
