"""The grammar compile cache holds at most its byte budget (issue 34, row 1): least recently submitted entries are
evicted once compiled grammars' sizes exceed it, an entry a client waits for is kept, and a grammar larger than
the whole budget is refused with a ValueError naming the flag."""

from __future__ import annotations

import threading

import pytest

from radixlm.structured.compile_cache import LIGHT_SPEC_CHARS, GrammarCompileCache
from radixlm.structured.grammar_spec import GrammarSpec


class Sized:
    """A backend whose grammar `a{n}` compiles to an object of n bytes."""

    vocab_size = 8

    def __init__(self) -> None:
        self.num_compiles = 0

    def compile(self, spec: GrammarSpec) -> bytes:
        self.num_compiles += 1
        return b"x" * len(spec.text)

    def memory_size(self, compiled: bytes) -> int:
        return len(compiled)


def regex(num_bytes: int, letter: str = "a") -> GrammarSpec:
    return GrammarSpec.from_regex(letter * num_bytes)


@pytest.fixture
def cache():
    cache = GrammarCompileCache(Sized(), max_bytes=100)
    yield cache
    cache.shutdown()


def test_bytes_stay_within_the_budget_least_recent_first(cache):
    first, second, third = regex(40, "a"), regex(40, "b"), regex(40, "c")
    cache.compile(first)
    cache.compile(second)
    cache.compile(first)  # used again: now the most recent
    cache.compile(third)
    stats = cache.stats()
    assert (stats.num_bytes, stats.num_entries, stats.num_evictions, stats.budget_bytes) == (80, 2, 1, 100)
    num_compiles = cache.backend.num_compiles
    cache.compile(first)  # kept
    assert cache.backend.num_compiles == num_compiles
    cache.compile(second)  # evicted: compiled again
    assert cache.backend.num_compiles == num_compiles + 1
    assert cache.stats().num_bytes <= 100


def test_an_entry_a_client_waits_for_is_not_evicted(cache):
    waited = regex(60, "a")
    cache.submit(waited, client=True).result(10)
    for letter in "bcd":
        cache.compile(regex(30, letter))
    assert cache.stats().num_evictions == 2 and cache.stats().num_bytes == 90  # b and c went, not the waited one
    cache.release(waited)
    cache.compile(regex(30, "e"))  # over budget again: the released grammar is the least recent now
    assert cache.stats().num_evictions == 3 and cache.stats().num_bytes == 60
    cache.compile(waited)
    assert cache.backend.num_compiles == 6


def test_a_grammar_larger_than_the_budget_is_refused(cache):
    with pytest.raises(ValueError, match=r"--grammar-cache-bytes, 0\.0 MiB"):
        cache.compile(regex(101))
    assert cache.stats().num_bytes == 0


def test_many_distinct_schemas_on_xgrammar_stay_within_the_budget(backend):
    """Real compiled grammars: 24 distinct schemas of ~0.2 MiB each through a 1 MiB budget."""
    def schema(seed: int) -> GrammarSpec:
        properties = {f"k{seed}_{i}": {"type": "string", "pattern": "[a-z]{1,4}"} for i in range(40)}
        return GrammarSpec.from_json_schema({"type": "object", "properties": properties})

    assert backend.memory_size(backend.compile(schema(0))) > 10_000
    cache = GrammarCompileCache(backend, max_bytes=2**20)
    try:
        for seed in range(24):
            cache.compile(schema(seed))
            assert cache.stats().num_bytes <= 2**20
        assert cache.stats().num_evictions > 0
    finally:
        cache.shutdown()


def test_a_small_grammar_does_not_wait_behind_a_big_one():
    """Big specs compile on their own thread (an 84 KB schema took 30-40 s on the default model)."""
    release = threading.Event()

    class SlowWhenBig(Sized):
        def compile(self, spec: GrammarSpec) -> bytes:
            if len(spec.text) > LIGHT_SPEC_CHARS:
                release.wait(10)
            return super().compile(spec)

    cache = GrammarCompileCache(SlowWhenBig(), max_bytes=2**20)
    try:
        big = cache.submit(regex(LIGHT_SPEC_CHARS + 1))
        assert cache.submit(regex(10)).result(5) == b"x" * 10 and not big.done()
        release.set()
        assert len(big.result(10)) == LIGHT_SPEC_CHARS + 1
    finally:
        release.set()
        cache.shutdown()
