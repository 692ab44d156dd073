"""DataParallelEngine: N engine replicas behind one server, each request sent where its prefix is cached.

Each replica is a whole engine (its own scheduler, radix cache and KV cache) run by its own `AsyncEngine` thread;
its model worker runs in a child process (`--distributed-executor-backend mp`, the default for replicas), so the
replicas' forwards run in parallel on separate cores while the engine threads mostly wait on their pipes.
`--num-threads` applies to each replica's worker (default: the cores shared equally among the replicas).

It presents what the server uses of an `AsyncEngine` (`start`, `info`, `unavailable_reason`, `generate`, `abort`,
`shutdown`, `join`, `failure`, `metrics`):
- `generate` asks the `CacheAwareRouter` for a replica (a group of prompts goes together, routed by its first
  prompt) and admits there; the returned stream aborts on its own replica, and `abort(ids)` finds each id's replica.
- A replica's requests leave the router's load when they end (the replica's `on_ended`).
- Ready when every replica is; a failed replica fails the server: reading `failure` (the server polls it) shuts the
  other replicas down too, so every live request fails at once and the server exits.
- `/metrics` shows every replica's metrics with a `replica` label (`MergedMetrics`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from radixlm.data_parallel.router import CacheAwareRouter, RouterConfig
from radixlm.engine.async_engine import AsyncEngine, group_request_ids
from radixlm.engine.engine_info import EngineInfo
from radixlm.engine.llm_engine import LLMEngine
from radixlm.engine.output_stream import OutputStream
from radixlm.errors import ParamError
from radixlm.lora_request import LoRARequest, lora_id_of
from radixlm.metrics import EngineMetrics, MergedMetrics
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def replica_engine_options(options: dict[str, Any], replica: int) -> dict[str, Any]:
    """Replica `replica`'s engine options: its worker in a child process unless the user chose otherwise, its own
    trace file (`run.jsonl` -> `run.replica1.jsonl`) and, unless `num_threads` is given, an equal share of the
    cores torch would use (as tensor-parallel ranks share a node's): replicas that each took them all would run
    more threads than there are cores (two replicas of the default model on 2 cores: 11.2 s to build side by side
    against 4.2 s with a core each)."""
    replica_options = {"distributed_executor_backend": "mp", **options}
    num_replicas = options.get("data_parallel_size") or 1
    if options.get("num_threads") is None and num_replicas > 1:
        replica_options["num_threads"] = max(1, torch.get_num_threads() // num_replicas)
    trace = options.get("trace")
    if trace:
        path = Path(str(trace))
        replica_options["trace"] = str(path.with_name(f"{path.stem}.replica{replica}{path.suffix}"))
    return replica_options


class DataParallelEngine:
    """Replicas of one engine behind a cache-aware router; see the module docstring."""

    def __init__(self, engine_factories: Sequence[Callable[[], LLMEngine]], model_name: str,
                 router_config: RouterConfig | None = None) -> None:
        self.router = CacheAwareRouter(len(engine_factories), router_config)
        self.replicas = [AsyncEngine(factory, EngineMetrics(model_name, replica=i), on_ended=partial(self._ended, i))
                         for i, factory in enumerate(engine_factories)]
        self.metrics = MergedMetrics([replica.metrics for replica in self.replicas])
        self._replica_of: dict[str, int] = {}  # live request id -> replica (event loop only)
        self._failed_over = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        for replica in self.replicas:
            replica.start(loop)

    @property
    def info(self) -> EngineInfo | None:
        """Replica 0's info (the replicas run the same model) once every replica is ready."""
        if any(replica.info is None for replica in self.replicas):
            return None
        return self.replicas[0].info

    @property
    def unavailable_reason(self) -> str | None:
        for i, replica in enumerate(self.replicas):
            reason = replica.unavailable_reason
            if reason is not None:
                return f"replica {i}: {reason}" if replica.failure is not None else reason
        return None

    @property
    def failure(self) -> Exception | None:
        """The first replica failure; reading it after one shuts the other replicas down (their requests fail)."""
        for i, replica in enumerate(self.replicas):
            if replica.failure is not None:
                if not self._failed_over:
                    self._failed_over = True
                    logger.error("replica %d failed; stopping the others", i)
                    self.shutdown(f"replica {i} failed: {replica.failure}")
                return replica.failure
        return None

    async def generate(self, request_id: str, prompts: Sequence[list[int]], params: SamplingParams | PoolingParams,
                       priority: int = 0, arrival_time: float | None = None,
                       metadata: dict[str, str] | None = None, lora_name: str | None = None) -> OutputStream:
        """Route the group by its first prompt and LoRA adapter, then admit it on its replica (same contract as
        `AsyncEngine.generate`)."""
        request_ids = group_request_ids(request_id, len(prompts))
        lora = self.lora_requests.get(lora_name) if lora_name is not None else None
        decision = self.router.route(prompts[0], len(request_ids), lora_id_of(lora))
        logger.debug("request %s -> replica %d (%s, %d tokens matched)", request_id, decision.replica,
                     decision.reason, decision.matched_tokens)
        self._replica_of.update(dict.fromkeys(request_ids, decision.replica))
        try:
            return await self.replicas[decision.replica].generate(request_id, prompts, params, priority,
                                                                  arrival_time, metadata, lora_name)
        except BaseException:
            self._ended(decision.replica, request_ids)  # not admitted (or aborted while admitting)
            raise

    @property
    def lora_requests(self) -> dict[str, LoRARequest]:
        """The loaded LoRA adapters (every replica holds each one, under the same id)."""
        return self.replicas[0].lora_requests

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the adapter on every replica under one fresh id; if a replica refuses, the others unload it."""
        if name in self.lora_requests:
            raise ParamError("lora_name", f"adapter {name!r} is already loaded (unload it first)")
        lora_id = max((lora.lora_int_id for lora in self.lora_requests.values()), default=0) + 1
        lora_request = LoRARequest(name, lora_id, path)
        await self._on_every_replica(lambda replica: replica.add_lora(lora_request),
                                     lambda replica: replica.unload_lora_adapter(name))

    async def unload_lora_adapter(self, name: str) -> None:
        """Unload the adapter from every replica; if one refuses (a live request there runs it), the replicas that
        had unloaded it load it back, and its ValueError propagates."""
        lora_request = self.lora_requests.get(name)
        if lora_request is None:
            raise ParamError("lora_name", f"no adapter {name!r} is loaded")
        await self._on_every_replica(lambda replica: replica.unload_lora_adapter(name),
                                     lambda replica: replica.add_lora(lora_request))

    async def _on_every_replica(self, change: Callable[[AsyncEngine], Awaitable[None]],
                                undo: Callable[[AsyncEngine], Awaitable[None]]) -> None:
        """`change` each replica in turn; if one raises, `undo` the replicas already changed, then re-raise."""
        changed: list[AsyncEngine] = []
        try:
            for replica in self.replicas:
                await change(replica)
                changed.append(replica)
        except BaseException:
            for replica in changed:
                await undo(replica)
            raise

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests on their replicas (idempotent; unknown ids are ignored)."""
        by_replica: dict[int, list[str]] = {}
        for request_id in request_ids:
            replica = self._replica_of.get(request_id)
            if replica is not None:
                by_replica.setdefault(replica, []).append(request_id)
        for replica, ids in by_replica.items():
            self.replicas[replica].abort(ids)

    def shutdown(self, reason: str = "the server is shutting down") -> None:
        for replica in self.replicas:
            replica.shutdown(reason)

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for replica in self.replicas:
            replica.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def replica_of(self, request_id: str) -> int | None:
        """The replica running a live request (None once it ended)."""
        return self._replica_of.get(request_id)

    def _ended(self, replica: int, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self._replica_of.pop(request_id, None) is not None:
                self.router.finish(replica)
