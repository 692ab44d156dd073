"""Tokenizer work in fair turns (issue 34, row 3): a tiny job never waits behind a big one, the shortest queued job
of a lane goes first, a job whose caller left is skipped, and every string a chat template is given counts."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixlm.server.tokenization import LIGHT_JOB_CHARS, Tokenization, num_text_chars


class FakeTokenizer:
    """Stands in for a tokenizer: each lane deep-copies it."""


@pytest.fixture
def tokenization():
    tokenization = Tokenization()
    yield tokenization
    tokenization.shutdown()


def test_a_tiny_job_does_not_wait_behind_big_ones(tokenization):
    tokenizer = FakeTokenizer()

    async def scenario() -> tuple[float, float]:
        started = time.monotonic()
        big = [asyncio.create_task(tokenization.run(tokenizer, 10**6, lambda _: time.sleep(0.5)))
               for _ in range(4)]  # 2 s of queued work: one at a time on the heavy lane
        await asyncio.sleep(0.05)
        tiny_started = time.monotonic()
        assert await tokenization.run(tokenizer, 5, lambda copy, text: (type(copy), text), "hi") == \
            (FakeTokenizer, "hi")
        tiny = time.monotonic() - tiny_started
        await asyncio.gather(*big)
        return tiny, time.monotonic() - started

    tiny, total = asyncio.run(scenario())
    assert total >= 2.0 and tiny < 0.5, (tiny, total)


def test_the_shortest_queued_job_runs_first_and_a_gone_one_is_skipped(tokenization):
    tokenizer, order, release = FakeTokenizer(), [], threading.Event()

    async def scenario() -> None:
        blocker = asyncio.create_task(tokenization.run(tokenizer, 1, lambda _: release.wait(10)))
        await asyncio.sleep(0.05)  # the light lane is busy: the jobs below queue
        jobs = {size: asyncio.create_task(tokenization.run(tokenizer, size, lambda _, n: order.append(n), size))
                for size in (5_000, 10, 3_000, 7)}
        await asyncio.sleep(0.05)
        jobs[7].cancel()  # its client left
        release.set()
        await blocker
        await asyncio.gather(*(job for size, job in jobs.items() if size != 7))

    asyncio.run(scenario())
    assert order == [10, 3_000, 5_000]


def test_errors_reach_the_caller(tokenization):
    def fails(_: FakeTokenizer) -> None:
        raise ValueError("bad template")

    with pytest.raises(ValueError, match="bad template"):
        asyncio.run(tokenization.run(FakeTokenizer(), LIGHT_JOB_CHARS + 1, fails))


def test_every_string_counts():
    messages = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "x" * 1000}}]}]
    assert num_text_chars(messages) == sum(map(len, ("role", "assistant", "content", "tool_calls", "id", "c1", "type",
                                                     "function", "function", "name", "f", "arguments"))) + 1000
    deep: list = []
    for _ in range(100_000):
        deep = [deep, "ab"]
    assert num_text_chars(deep) == 200_000
    assert num_text_chars(None) == 0
