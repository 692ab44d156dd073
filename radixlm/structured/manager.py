"""StructuredOutputs: the engine's constrained-decoding state: backend, compile cache, per-step masks."""

from __future__ import annotations

import copy
import threading
from concurrent.futures import Future

from transformers import PreTrainedTokenizerBase

from radixlm.structured.backend import GrammarBackend, GrammarMatcher
from radixlm.structured.compile_cache import GrammarCacheStats, GrammarCompileCache
from radixlm.structured.grammar_spec import GrammarSpec


class StructuredOutputs:
    """Built with the engine; the grammar backend itself is created on the first constrained request, so engines
    that never see one pay nothing (not even the import). `submit` may be called from any thread."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: list[int],
                 max_cache_bytes: int) -> None:
        # An own copy: the backend may be built from the server's thread while the engine thread decodes, and a
        # fast tokenizer must not be used from two threads at once.
        self._tokenizer = copy.deepcopy(tokenizer)
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._max_cache_bytes = max_cache_bytes
        self._lock = threading.Lock()
        self._cache: GrammarCompileCache | None = None

    @property
    def backend(self) -> GrammarBackend:
        return self._compile_cache().backend

    def _compile_cache(self) -> GrammarCompileCache:
        with self._lock:
            if self._cache is None:
                from radixlm.structured.xgrammar_backend import XGrammarBackend

                self._cache = GrammarCompileCache(
                    XGrammarBackend(self._tokenizer, self._vocab_size, self._stop_token_ids), self._max_cache_bytes)
            return self._cache

    def submit(self, spec: GrammarSpec, client: bool = False) -> Future[object]:
        """Start compiling (or find the compiled) grammar; the Future raises ValueError for a bad grammar.
        `client`: a client waits for it, and calls `release(spec)` when it stops waiting (see GrammarCompileCache)."""
        return self._compile_cache().submit(spec, client)

    def release(self, spec: GrammarSpec) -> None:
        self._compile_cache().release(spec)

    def cache_stats(self) -> GrammarCacheStats:
        """The compile cache's bytes and entries (nothing held before the first constrained request)."""
        with self._lock:
            cache = self._cache
        return cache.stats() if cache is not None else GrammarCacheStats(0, self._max_cache_bytes, 0, 0)

    def new_matcher(self, compiled: object) -> GrammarMatcher:
        return self.backend.new_matcher(compiled)
