"""32 concurrent greedy chat requests each return exactly what they return when sent alone."""

from __future__ import annotations

import asyncio

import pytest

from server.harness import ServerAccess
from server.inprocess import InProcessServer

TOPICS = ["the quick brown fox", "a paged KV cache", "continuous batching", "radix trees", "héllo wörld 你好",
          "import torch", "numbers 0123456789", "the lazy dog"]


def conversations(count: int) -> list[list[dict[str, str]]]:
    """Distinct conversations of different lengths (some share a system prompt, as real traffic does)."""
    result = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        messages = [{"role": "user", "content": f"{topic} " * (1 + i % 5) + f"#{i}"}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "You are a careful assistant. " * 3})
        result.append(messages)
    return result


async def ask(client, model: str, messages, max_tokens: int, stream: bool) -> str:
    if not stream:
        response = await client.chat.completions.create(model=model, messages=messages, temperature=0,
                                                        max_tokens=max_tokens)
        return response.choices[0].message.content
    parts = []
    async for chunk in await client.chat.completions.create(model=model, messages=messages, temperature=0,
                                                            max_tokens=max_tokens, stream=True):
        parts += [choice.delta.content or "" for choice in chunk.choices]
    return "".join(parts)


def check_concurrent_equals_alone(server: ServerAccess, count: int, max_tokens: int) -> dict[str, float]:
    """Returns the metrics after the concurrent run."""
    model = server.client().models.list().data[0].id
    chats = conversations(count)

    async def alone() -> list[str]:
        client = server.async_client()
        return [await ask(client, model, messages, max_tokens, stream=False) for messages in chats]

    async def together() -> list[str]:
        client = server.async_client()
        return await asyncio.gather(*(ask(client, model, messages, max_tokens, stream=i % 2 == 1)
                                      for i, messages in enumerate(chats)))

    expected = asyncio.run(alone())
    peak = {"running": 0.0}

    async def together_watching_batch() -> list[str]:
        task = asyncio.ensure_future(together())
        while not task.done():
            peak["running"] = max(peak["running"], server.metrics()["radixlm:num_requests_running{}"])
            await asyncio.sleep(0.02)
        return task.result()

    assert asyncio.run(together_watching_batch()) == expected
    assert peak["running"] > 1, "the requests never ran in one batch"
    return server.metrics()


def test_32_concurrent_chats_equal_alone_tiny(tiny_model_dir):
    """A KV cache too small for all 32 at once: the batch preempts, and every answer still matches."""
    server = InProcessServer(tiny_model_dir("llama"), {"num_kv_blocks": 128, "block_size": 4})
    try:
        metrics = check_concurrent_equals_alone(server, count=32, max_tokens=24)
    finally:
        server.stop()
    assert metrics["radixlm:num_preemptions_total{}"] > 0
    assert metrics["radixlm:request_finished_total{finished_reason=length}"] + metrics.get(
        "radixlm:request_finished_total{finished_reason=stop}", 0) == 64


@pytest.mark.slow
def test_32_concurrent_chats_equal_alone_default_model(default_tool_server):
    """On the session's default-model server (a real `radixlm serve` process, up to 32 running requests)."""
    check_concurrent_equals_alone(default_tool_server, count=32, max_tokens=8)
