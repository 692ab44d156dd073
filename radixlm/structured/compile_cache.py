"""GrammarCompileCache: compiles grammars on a worker thread, once per distinct spec, within a byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from radixlm.background_threads import lower_priority, release_free_memory
from radixlm.structured.backend import GrammarBackend
from radixlm.structured.grammar_spec import GrammarSpec

MIB = 2**20
LIGHT_SPEC_CHARS = 4_096  # specs up to this size compile on the light thread (a tool's schema is usually ~1 KB)


@dataclass(frozen=True)
class GrammarCacheStats:
    """What the compile cache holds now: compiled bytes, the budget, entries (compiled, failed or compiling) and
    the entries evicted since start."""

    num_bytes: int
    budget_bytes: int
    num_entries: int
    num_evictions: int


class GrammarCompileCache:
    """`submit(spec)` returns a Future of the compiled grammar; the same spec shares one Future (and one compile).

    Compiling happens on two background threads, so a request waiting for its grammar never stalls the engine's
    step loop: specs of at most `LIGHT_SPEC_CHARS` characters on one, bigger ones on the other, so that a small
    schema never waits behind a big one (xgrammar releases the GIL while it compiles; an 84 KB schema of 1,500
    patterned strings takes 30-40 s on the default model's vocabulary), and the heavy thread runs at the lowest
    CPU priority, so that it never takes a core from the model's step (`background_threads.py`). A failed compile
    stays cached as a failed Future (its ValueError names the problem).

    Bounded in bytes: a compiled grammar's size (`GrammarBackend.memory_size`) counts once its compile ends, and the
    least recently submitted entries are evicted until the sizes fit `max_bytes` (and the entries `max_entries`). A
    grammar larger than the whole budget fails (ValueError naming the budget) instead of being kept, so no client
    can make the cache hold more than `max_bytes`. Requests already running keep the grammar they use alive until
    they end (their matchers hold it); an evicted grammar asked for again is compiled again.

    Clients that wait for a compile are counted (`submit(spec, client=True)`, then `release`): a compile that no
    client waits for any more and that has not started is cancelled, so a client that leaves does not keep its
    place in the queue; an entry a client waits for is not evicted. Thread-safe.
    """

    def __init__(self, backend: GrammarBackend, max_bytes: int, max_entries: int = 1024) -> None:
        self.backend = backend
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.num_evictions = 0
        self._num_bytes = 0
        self._futures: OrderedDict[GrammarSpec, Future[object]] = OrderedDict()  # least recently submitted first
        self._sizes: dict[GrammarSpec, int] = {}  # compiled entries' bytes
        self._num_clients: dict[GrammarSpec, int] = {}
        self._lock = threading.RLock()  # re-entrant: a done callback may run inside submit()
        self._light = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlm-grammar")
        self._heavy = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlm-grammar-heavy",
                                         initializer=lower_priority)

    def submit(self, spec: GrammarSpec, client: bool = False) -> Future[object]:
        """The compile of `spec`; `client`: count a waiting client, who must `release(spec)` once done waiting."""
        with self._lock:
            future = self._futures.get(spec)
            if future is None:
                lane = self._light if len(spec.text) <= LIGHT_SPEC_CHARS else self._heavy
                future = lane.submit(self._compile, spec)
                self._futures[spec] = future
                future.add_done_callback(lambda done: self._settle(spec, done))
                self._evict()
            else:
                self._futures.move_to_end(spec)
            if client:
                self._num_clients[spec] = self._num_clients.get(spec, 0) + 1
            return future

    def release(self, spec: GrammarSpec) -> None:
        """A client stops waiting for `spec`; the last one to leave cancels a compile that has not started."""
        with self._lock:
            remaining = self._num_clients.get(spec, 0) - 1
            if remaining > 0:
                self._num_clients[spec] = remaining
                return
            self._num_clients.pop(spec, None)
            future = self._futures.get(spec)
            if future is not None and future.cancel():  # only a compile still queued can be cancelled
                self._drop(spec)
            self._evict()

    def compile(self, spec: GrammarSpec) -> object:
        """Blocking form of `submit` (raises the compile's ValueError)."""
        return self.submit(spec).result()

    def stats(self) -> GrammarCacheStats:
        with self._lock:
            return GrammarCacheStats(self._num_bytes, self.max_bytes, len(self._futures), self.num_evictions)

    def shutdown(self) -> None:
        self._light.shutdown(wait=False, cancel_futures=True)
        self._heavy.shutdown(wait=False, cancel_futures=True)

    def _compile(self, spec: GrammarSpec) -> object:
        compiled = self.backend.compile(spec)
        num_bytes = self.backend.memory_size(compiled)
        if num_bytes > self.max_bytes:
            raise ValueError(f"the compiled grammar takes {num_bytes / MIB:.1f} MiB, more than the server's "
                             f"grammar cache holds (--grammar-cache-bytes, {self.max_bytes / MIB:.1f} MiB); "
                             f"simplify it")
        return compiled

    def _settle(self, spec: GrammarSpec, future: Future[object]) -> None:
        """A compile ended: count its bytes, then evict down to the budget. After a big one, the free memory its
        temporaries (and any evicted grammar) left goes back to the system."""
        with self._lock:
            if self._futures.get(spec) is not future or future.cancelled() or future.exception() is not None:
                return
            self._sizes[spec] = self.backend.memory_size(future.result())
            self._num_bytes += self._sizes[spec]
            self._evict()
        if len(spec.text) > LIGHT_SPEC_CHARS:
            release_free_memory()

    def _evict(self) -> None:
        """Drop the least recently submitted entries no client waits for (not compiling: a compile cannot be
        interrupted, and its bytes count only once it ends) until bytes and entries fit."""
        for spec in list(self._futures):
            if self._num_bytes <= self.max_bytes and len(self._futures) <= self.max_entries:
                return
            if spec not in self._num_clients and self._futures[spec].done():
                self._drop(spec)
                self.num_evictions += 1

    def _drop(self, spec: GrammarSpec) -> None:
        del self._futures[spec]
        self._num_bytes -= self._sizes.pop(spec, 0)
