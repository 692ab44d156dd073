"""GrammarCompileCache: compiles grammars on a worker thread, once per distinct spec."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from radixlm.structured.backend import GrammarBackend
from radixlm.structured.spec import GrammarSpec


class GrammarCompileCache:
    """`submit(spec)` returns a Future of the compiled grammar; the same spec shares one Future (and one compile).

    Compiling happens on one background thread, so a request waiting for its grammar never stalls the engine's
    step loop. A failed compile stays cached as a failed Future (its ValueError names the problem). Clients that
    wait for a compile are counted (`submit(spec, client=True)`, then `release`): a compile that no client waits for
    any more and that has not started is cancelled, so a client that leaves does not keep its place in the queue.
    Not thread-safe: the caller serialises calls (StructuredOutputs holds a lock).
    """

    def __init__(self, backend: GrammarBackend, max_entries: int = 1024) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self._futures: dict[GrammarSpec, Future[object]] = {}
        self._num_clients: dict[GrammarSpec, int] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlm-grammar")

    def submit(self, spec: GrammarSpec, client: bool = False) -> Future[object]:
        """The compile of `spec`; `client`: count a waiting client, who must `release(spec)` once done waiting."""
        future = self._futures.get(spec)
        if future is None:
            if len(self._futures) >= self.max_entries:
                self._futures.pop(next(iter(self._futures)))  # oldest first
            future = self._executor.submit(self.backend.compile, spec)
            self._futures[spec] = future
        if client:
            self._num_clients[spec] = self._num_clients.get(spec, 0) + 1
        return future

    def release(self, spec: GrammarSpec) -> None:
        """A client stops waiting for `spec`; the last one to leave cancels a compile that has not started."""
        remaining = self._num_clients.get(spec, 0) - 1
        if remaining > 0:
            self._num_clients[spec] = remaining
            return
        self._num_clients.pop(spec, None)
        future = self._futures.get(spec)
        if future is not None and future.cancel():  # only a compile still queued can be cancelled
            del self._futures[spec]

    def compile(self, spec: GrammarSpec) -> object:
        """Blocking form of `submit` (raises the compile's ValueError)."""
        return self.submit(spec).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
