"""DataParallelLLMEngine: the offline `LLM(..., data_parallel_size=N)`: N engine replicas, one router, one caller.

Each replica is a whole `LLMEngine` whose model worker runs in a child process (unless the options say otherwise), so
replicas compute in parallel on separate cores. It offers what `LLM` uses of an `LLMEngine`:
- `add_requests` routes each prompt with the `CacheAwareRouter` (all requests are routed before any runs, so the
  router balances by count and keeps shared prefixes together) and adds it to its replica, all or nothing;
- `step()` keeps every replica with work stepping in its own thread and returns the outputs of the first step to
  complete (its replica then steps again on the next call): replicas run free, none waits for a slower one;
- `has_unfinished_requests()` is true while any replica has work or a step in flight.
Requests may be added only between runs (when `has_unfinished_requests()` is false): an engine is not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as Seq
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from radixlm.data_parallel.engine import replica_engine_options
from radixlm.data_parallel.router import CacheAwareRouter
from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.lora_request import LoRARequest, lora_id_of
from radixlm.outputs import RequestOutput
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams


class DataParallelLLMEngine:
    """Replicas of one engine stepped side by side; see the module docstring."""

    def __init__(self, engine_options: dict[str, Any], num_replicas: int) -> None:
        with ThreadPoolExecutor(num_replicas) as pool:  # the replicas load their models at the same time
            futures = [pool.submit(build_engine, **replica_engine_options(engine_options, i))
                       for i in range(num_replicas)]
            self.engines: list[LLMEngine] = [future.result() for future in futures]
        self.router = CacheAwareRouter(num_replicas)
        self._pool = ThreadPoolExecutor(num_replicas, thread_name_prefix="radixlm-replica")
        self._steps: dict[Future[list[RequestOutput]], int] = {}  # step in flight -> replica
        self._replica_of: dict[str, int] = {}  # live request id -> replica

    # what LLM reads from its engine: the replicas share model, tokenizer and config
    @property
    def tokenizer(self) -> Any:
        return self.engines[0].tokenizer

    @property
    def structured(self) -> Any:
        return self.engines[0].structured

    @property
    def config(self) -> Any:
        return self.engines[0].config

    def add_requests(self, requests: Iterable[tuple[str, str | Seq[int], SamplingParams | PoolingParams | None]],
                     priority: int = 0, arrival_time: float | None = None, metadata: Mapping[str, Any] | None = None,
                     on_finish: Callable[[RequestOutput], object] | None = None,
                     lora_request: LoRARequest | Seq[LoRARequest | None] | None = None) -> None:
        """Route each (request_id, prompt, params) by its prompt and LoRA adapter (`lora_request`: one for all, or
        one per request) and add it to its replica (which loads a new adapter first); if one replica refuses, the
        requests already added elsewhere are aborted before the error propagates."""
        if self._steps:
            raise RuntimeError("requests can only be added while no step is running")
        requests = list(requests)
        loras = [lora_request] * len(requests) if lora_request is None or isinstance(lora_request, LoRARequest) \
            else list(lora_request)
        by_replica: dict[int, list[tuple[str, str | Seq[int], SamplingParams | PoolingParams | None]]] = {}
        replica_loras: dict[int, list[LoRARequest | None]] = {}
        for request, lora in zip(requests, loras, strict=True):
            prompt = request[1]
            token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
            replica = self.router.route(token_ids, lora_id=lora_id_of(lora)).replica
            by_replica.setdefault(replica, []).append(request)
            replica_loras.setdefault(replica, []).append(lora)
            self._replica_of[request[0]] = replica
        added: list[tuple[int, str]] = []
        try:
            for replica, group in by_replica.items():
                self.engines[replica].add_requests(group, priority, arrival_time, metadata, on_finish,
                                                   lora_request=replica_loras[replica])
                added += [(replica, request_id) for request_id, _, _ in group]
        except Exception:
            for replica, request_id in added:
                self.engines[replica].abort_request(request_id)
            for request_id in [r[0] for group in by_replica.values() for r in group]:
                self._release(request_id)
            raise

    def has_unfinished_requests(self) -> bool:
        busy = set(self._steps.values())
        return bool(busy) or any(engine.has_unfinished_requests()
                                 for i, engine in enumerate(self.engines) if i not in busy)

    def step(self) -> list[RequestOutput]:
        """Start a step on every idle replica with work, then return the outputs of the first step to finish."""
        busy = set(self._steps.values())
        for i, engine in enumerate(self.engines):
            if i not in busy and engine.has_unfinished_requests():
                self._steps[self._pool.submit(engine.step)] = i
        if not self._steps:
            return []
        done, _ = wait(list(self._steps), return_when=FIRST_COMPLETED)
        outputs: list[RequestOutput] = []
        for future in done:
            del self._steps[future]
            outputs += future.result()  # an engine that cannot go on raises here, as LLMEngine.step would
        for output in outputs:
            if output.finished:
                self._release(output.request_id)
        return outputs

    def close(self) -> None:
        """Wait for the steps in flight, then stop every replica's worker."""
        wait(list(self._steps))
        self._steps.clear()
        self._pool.shutdown()
        for engine in self.engines:
            engine.close()

    def _release(self, request_id: str) -> None:
        replica = self._replica_of.pop(request_id, None)
        if replica is not None:
            self.router.finish(replica)
