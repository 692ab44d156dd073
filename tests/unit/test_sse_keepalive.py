"""`with_keepalive`: a ping comment on each idle interval, every frame in order, and the frames' `finally` runs
however the stream ends (a client that leaves mid-wait included)."""

from __future__ import annotations

import asyncio

from radixlm.server.serving import KEEPALIVE_FRAME, with_keepalive


def run(coroutine):
    return asyncio.run(coroutine)


def test_pings_fill_long_waits_and_frames_keep_their_order():
    async def frames():
        yield "a"
        await asyncio.sleep(0.25)
        yield "b"

    async def main():
        return [frame async for frame in with_keepalive(frames(), interval=0.05)]

    received = run(main())
    assert [f for f in received if f != KEEPALIVE_FRAME] == ["a", "b"]
    assert received[0] == "a" and received.count(KEEPALIVE_FRAME) >= 3
    assert KEEPALIVE_FRAME.startswith(":") and KEEPALIVE_FRAME.endswith("\n\n")  # an SSE comment


def test_no_ping_when_frames_come_fast():
    async def frames():
        for i in range(5):
            yield str(i)

    async def main():
        return [frame async for frame in with_keepalive(frames(), interval=10)]

    assert run(main()) == ["0", "1", "2", "3", "4"]


def test_a_client_that_leaves_mid_wait_closes_the_frames():
    ended = []

    async def frames():
        try:
            yield "a"
            await asyncio.sleep(60)
            yield "never"
        finally:
            ended.append(True)

    async def main():
        stream = with_keepalive(frames(), interval=0.01)
        assert await anext(stream) == "a"
        assert await anext(stream) == KEEPALIVE_FRAME
        await stream.aclose()

    run(main())
    assert ended == [True]


def test_a_failure_in_the_frames_reaches_the_reader():
    async def frames():
        yield "a"
        raise ValueError("boom")

    async def main():
        return [frame async for frame in with_keepalive(frames(), interval=10)]

    try:
        run(main())
    except ValueError as error:
        assert str(error) == "boom"
    else:
        raise AssertionError("the failure was swallowed")


def test_a_cancelled_response_task_closes_the_frames():
    """Starlette cancels the task that sends the response when the client disconnects."""
    ended = []

    async def frames():
        try:
            yield "a"
            await asyncio.sleep(60)
        finally:
            ended.append(True)

    async def consume():
        async for _ in with_keepalive(frames(), interval=0.01):
            pass

    async def main():
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(main())
    assert ended == [True]
