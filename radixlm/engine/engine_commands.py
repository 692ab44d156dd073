"""The commands the server's event loop queues for the engine thread (`radixlm.engine.async_engine`), and how the
thread answers them: each carries a Future of the event loop, resolved with `resolve` through
`loop.call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.engine.llm_engine import LLMEngine
from radixlm.engine.output_stream import OutputStream
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams


@dataclass
class AdmitCommand:
    """Admit one request per prompt into `stream`; `done` resolves once they are all admitted (or refused)."""

    prompts: list[list[int]]
    params: SamplingParams | PoolingParams
    priority: int
    arrival_time: float
    stream: OutputStream
    done: asyncio.Future[None] = field(repr=False)
    metadata: dict[str, str] | None = None
    lora_name: str | None = None


@dataclass
class EngineCall:
    """Run `function(engine)` on the engine thread between steps; its result or exception resolves `done`."""

    function: Callable[[LLMEngine], object]
    done: asyncio.Future[object] = field(repr=False)


@dataclass
class AbortCommand:
    """Abort these requests (unknown or finished ones are ignored)."""

    request_ids: list[str]


def resolve(done: asyncio.Future[Any], error: BaseException | None, result: object = None) -> None:
    if done.cancelled():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
