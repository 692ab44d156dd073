"""GrammarCompileCache: compiles grammars on a worker thread, once per distinct spec."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from radixlm.structured.backend import GrammarBackend
from radixlm.structured.spec import GrammarSpec


class GrammarCompileCache:
    """`submit(spec)` returns a Future of the compiled grammar; the same spec shares one Future (and one compile).

    Compiling happens on one background thread, so a request waiting for its grammar never stalls the engine's
    step loop. A failed compile stays cached as a failed Future (its ValueError names the problem).
    """

    def __init__(self, backend: GrammarBackend, max_entries: int = 1024) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self._futures: dict[GrammarSpec, Future[object]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlm-grammar")

    def submit(self, spec: GrammarSpec) -> Future[object]:
        future = self._futures.get(spec)
        if future is None:
            if len(self._futures) >= self.max_entries:
                self._futures.pop(next(iter(self._futures)))  # oldest first
            future = self._executor.submit(self.backend.compile, spec)
            self._futures[spec] = future
        return future

    def compile(self, spec: GrammarSpec) -> object:
        """Blocking form of `submit` (raises the compile's ValueError)."""
        return self.submit(spec).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
