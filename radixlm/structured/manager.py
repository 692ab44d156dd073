"""StructuredOutputs: the engine's constrained-decoding state: backend, compile cache, per-step masks."""

from __future__ import annotations

import copy
import threading
from concurrent.futures import Future

import torch
from transformers import PreTrainedTokenizerBase

from radixlm.structured.backend import GrammarBackend, GrammarMatcher
from radixlm.structured.compile_cache import GrammarCompileCache
from radixlm.structured.spec import GrammarSpec


class StructuredOutputs:
    """Built with the engine; the grammar backend itself is created on the first constrained request, so engines
    that never see one pay nothing (not even the import). `submit` may be called from any thread."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: list[int]) -> None:
        # An own copy: the backend may be built from the server's thread while the engine thread decodes, and a
        # fast tokenizer must not be used from two threads at once.
        self._tokenizer = copy.deepcopy(tokenizer)
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._lock = threading.Lock()
        self._cache: GrammarCompileCache | None = None
        self._bitmask: torch.Tensor | None = None

    @property
    def backend(self) -> GrammarBackend:
        return self._compile_cache().backend

    def _compile_cache(self) -> GrammarCompileCache:
        with self._lock:
            if self._cache is None:
                from radixlm.structured.xgrammar_backend import XGrammarBackend

                self._cache = GrammarCompileCache(
                    XGrammarBackend(self._tokenizer, self._vocab_size, self._stop_token_ids))
            return self._cache

    def submit(self, spec: GrammarSpec) -> Future[object]:
        """Start compiling (or find the compiled) grammar; the Future raises ValueError for a bad grammar."""
        cache = self._compile_cache()
        with self._lock:
            return cache.submit(spec)

    def new_matcher(self, compiled: object) -> GrammarMatcher:
        return self.backend.new_matcher(compiled)

    def apply_masks(self, logits: torch.Tensor, rows: list[int], matchers: list[GrammarMatcher]) -> None:
        """Mask `logits[rows[i]]` to what `matchers[i]` allows next; the other rows are left alone."""
        backend = self.backend
        if self._bitmask is None or self._bitmask.shape[0] < logits.shape[0]:
            self._bitmask = backend.allocate_bitmask(max(logits.shape[0], 64))
        for row, matcher in zip(rows, matchers, strict=True):
            matcher.fill_bitmask(self._bitmask, row)
        backend.apply_bitmask(logits, self._bitmask, rows)
