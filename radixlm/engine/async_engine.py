"""AsyncEngine: runs one LLMEngine in its own thread and streams each request's outputs to asyncio.

Contract:
- `start(loop)` builds the engine inside the engine thread, so a server answers (503) while the model loads;
  `info` is None until the engine is ready.
- `generate(prompts, params, ...)` hands a group of requests (one per prompt) to the engine thread and returns
  once they are all admitted, or raises what admission raised: ValueError (a bad prompt), QueueFullError (too many
  waiting requests) or EngineUnavailableError (loading, shutting down, failed). A failed group leaves nothing
  queued. The returned OutputStream yields `(prompt index, RequestOutput)` until every request has finished.
- The engine is not thread-safe: admissions and aborts are queued and applied by the engine thread between steps.
  With no work the thread blocks on its command queue (no spinning: the CPU belongs to the model).
- Outputs reach the event loop through one `loop.call_soon_threadsafe` per step.
- `shutdown(reason)`: every live stream raises EngineUnavailableError(reason) and the thread exits after its step.
- `on_ended(request_ids)` (optional, for a data-parallel router's loads) runs on the event loop in the same callback
  that delivers the outputs of the step in which those admitted requests ended (finished, aborted or failed), so it
  has run before any consumer sees their last output.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from radixlm.engine.engine_commands import AbortCommand, AdmitCommand, EngineCall, resolve
from radixlm.engine.engine_info import EngineInfo, scheduler_stats
from radixlm.engine.kv_tiers import kv_tier_samples
from radixlm.engine.llm_engine import LLMEngine
from radixlm.engine.output_stream import OutputStream
from radixlm.errors import ParamError
from radixlm.lora_request import LoRARequest
from radixlm.metrics import EngineMetrics
from radixlm.outputs import RequestOutput
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineUnavailableError(RuntimeError):
    """The engine cannot take or finish requests: it is loading, shutting down or has failed."""


_SHUTDOWN = object()
IDLE_HEALTH_SECONDS = 0.5  # an idle engine checks its worker processes this often


class AsyncEngine:
    """Owns the engine thread; see the module docstring for the contract."""

    def __init__(self, engine_factory: Callable[[], LLMEngine], metrics: EngineMetrics,
                 on_ended: Callable[[list[str]], object] | None = None) -> None:
        self.metrics = metrics
        self._on_ended = on_ended
        self._ended: list[str] = []  # engine thread only: admitted requests that ended since the last delivery
        self.info: EngineInfo | None = None
        self.failure: Exception | None = None  # why the engine failed to load or to step; the server should exit
        self._engine_factory = engine_factory
        self._commands: queue.SimpleQueue[object] = queue.SimpleQueue()
        # Guards _unavailable_reason, so that no admission is queued after the thread stopped taking them.
        # Re-entrant: shutdown() runs in a signal handler, possibly while the loop thread holds the lock.
        self._lock = threading.RLock()
        self._unavailable_reason: str | None = None
        self._streams: dict[str, OutputStream] = {}  # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # The loaded LoRA adapters by name: replaced whole by the engine thread after each change, read anywhere.
        self.lora_requests: dict[str, LoRARequest] = {}

    # -- event loop side ---------------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="radixlm-engine", daemon=True)
        self._thread.start()

    @property
    def unavailable_reason(self) -> str | None:
        """Why requests are refused now (loading, shutting down, failed), or None when serving."""
        if self._unavailable_reason is not None:
            return self._unavailable_reason
        return "the model is loading" if self.info is None else None

    async def generate(self, request_id: str, prompts: Sequence[list[int]], params: SamplingParams | PoolingParams,
                       priority: int = 0, arrival_time: float | None = None,
                       metadata: dict[str, str] | None = None, lora_name: str | None = None) -> OutputStream:
        """Admit one request per prompt (ids `request_id` or `request_id-i`), with the client's `metadata` (kept
        on the outputs and in the trace), running LoRA adapter `lora_name` (None: the base model; ValueError if it
        is not loaded when the engine admits it); PoolingParams: embedding requests. See the module docstring."""
        assert self._loop is not None, "start() first"
        stream = OutputStream(self.abort, group_request_ids(request_id, len(prompts)))
        done: asyncio.Future[None] = self._loop.create_future()
        admission = AdmitCommand(list(prompts), params, priority, arrival_time or time.monotonic(), stream, done,
                                  metadata, lora_name)
        with self._lock:
            reason = self.unavailable_reason
            if reason is not None:
                raise EngineUnavailableError(reason)
            self._commands.put(admission)
        try:
            await done
        except asyncio.CancelledError:
            stream.abort()  # the abort is queued behind the admission, so it always finds the requests
            raise
        return stream

    async def call(self, function: Callable[[LLMEngine], object]) -> object:
        """`function(engine)` run on the engine thread between steps (loading and unloading LoRA adapters); raises
        what it raised, or EngineUnavailableError."""
        assert self._loop is not None, "start() first"
        done: asyncio.Future[object] = self._loop.create_future()
        with self._lock:
            reason = self.unavailable_reason
            if reason is not None:
                raise EngineUnavailableError(reason)
            self._commands.put(EngineCall(function, done))
        return await done

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Check and load the adapter in `path` as `name` with a fresh id (see `LoRARegistry.load`)."""
        await self.call(lambda engine: engine.loras.load(name, path))

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Check and load an adapter under its own name and id (see `LoRARegistry.add`)."""
        await self.call(lambda engine: engine.loras.add(lora_request))

    async def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter `name`; ValueError if it is not loaded or a live request runs it."""
        await self.call(lambda engine: engine.loras.unload(name))

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests (thread-safe, idempotent); their final outputs still reach their stream."""
        self._commands.put(AbortCommand(request_ids))

    def shutdown(self, reason: str = "the server is shutting down") -> None:
        """Fail every live request with EngineUnavailableError(reason) and stop the thread (thread-safe)."""
        with self._lock:
            if self._unavailable_reason is None:
                self._unavailable_reason = reason
        self._commands.put(_SHUTDOWN)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- engine thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._engine_factory()
            self.info = EngineInfo(tokenizer=copy.deepcopy(engine.tokenizer), max_model_len=engine.max_model_len,
                                   vocab_size=engine.worker_info.vocab_size,
                                   schedule_policy=engine.config.scheduler.schedule_policy,
                                   prompts_per_request_limit=engine.config.scheduler.prompts_per_request_limit,
                                   structured=engine.structured, hidden_size=engine.worker_info.hidden_size)
            self.lora_requests = dict(engine.loras.by_name)
            self.metrics.observe_loras(None, 0, self.lora_requests)
            self.metrics.observe_scheduler(scheduler_stats(engine))
            self.metrics.watch_grammar_cache(engine.structured.cache_stats)
            self.metrics.watch(partial(kv_tier_samples, engine))
            logger.info("engine ready: max_model_len %d", engine.max_model_len)
            while self._run_once(engine):
                pass
        except Exception as error:
            if self.info is None and isinstance(error, (FileNotFoundError, ValueError)):
                logger.error("the engine could not start: %s", error)  # a user's mistake: no traceback
            else:
                logger.exception("the engine failed")
            self._stop(None, f"the engine failed: {error}")
            self.failure = error

    def _run_once(self, engine: LLMEngine) -> bool:
        """Apply the queued commands, then run one step if there is work; False once shut down. Raises if the
        engine's worker processes died (an idle engine notices within `IDLE_HEALTH_SECONDS`)."""
        engine.check_health()
        batch: list[tuple[OutputStream, RequestOutput | BaseException]] = []
        for command in self._take_commands(block=not engine.has_unfinished_requests()):
            if command is _SHUTDOWN:
                self._stop(engine, self._unavailable_reason or "the server is shutting down")
                return False
            if isinstance(command, AdmitCommand):
                self._admit(engine, command)
            elif isinstance(command, EngineCall):
                self._run_call(engine, command)
            elif isinstance(command, AbortCommand):
                outputs = [o for o in map(engine.abort_request, command.request_ids) if o is not None]
                self._route(outputs, batch)
        if engine.has_unfinished_requests():
            self._route(engine.step(), batch)
        self.metrics.observe_scheduler(scheduler_stats(engine))
        self._deliver(batch)
        return True

    def _take_commands(self, block: bool) -> list[object]:
        """The queued commands; `block`: wait for one, but at most `IDLE_HEALTH_SECONDS` (then maybe none)."""
        commands = []
        if block:
            try:
                commands.append(self._commands.get(timeout=IDLE_HEALTH_SECONDS))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _run_call(self, engine: LLMEngine, call: EngineCall) -> None:
        result: object = None
        error: BaseException | None = None
        try:
            result = call.function(engine)
        except Exception as exc:  # it belongs to the caller, never kills the engine
            error = exc
        self.lora_requests = dict(engine.loras.by_name)
        self.metrics.observe_loras(None, 0, self.lora_requests)
        self._loop.call_soon_threadsafe(resolve, call.done, error, result)  # type: ignore[union-attr]

    def _admit(self, engine: LLMEngine, admission: AdmitCommand) -> None:
        request_ids = admission.stream.request_ids
        error: BaseException | None = None
        try:
            lora_request = None
            if admission.lora_name is not None:
                lora_request = engine.loras.by_model_name(admission.lora_name)
                if lora_request is None:
                    raise ParamError("model", f"LoRA adapter {admission.lora_name!r} is not loaded")
            engine.add_requests([(request_id, prompt, admission.params)
                                 for request_id, prompt in zip(request_ids, admission.prompts, strict=True)],
                                priority=admission.priority, arrival_time=admission.arrival_time,
                                metadata=admission.metadata, lora_request=lora_request)
            if lora_request is not None:
                self.metrics.observe_loras(lora_request.lora_name, len(request_ids), self.lora_requests)
            self._streams.update(dict.fromkeys(request_ids, admission.stream))
        except Exception as exc:  # every admission error goes back to its caller, never kills the engine
            error = exc
        self._loop.call_soon_threadsafe(resolve, admission.done, error)  # type: ignore[union-attr]

    def _route(self, outputs: list[RequestOutput], batch: list[tuple[OutputStream, RequestOutput | BaseException]],
               ) -> None:
        self.metrics.observe_outputs(outputs, time.monotonic())
        for output in outputs:
            stream = self._streams.pop(output.request_id, None) if output.finished else \
                self._streams.get(output.request_id)
            if stream is not None:
                batch.append((stream, output))
                if output.finished:
                    self._ended.append(output.request_id)

    def _deliver(self, batch: list[tuple[OutputStream, RequestOutput | BaseException]]) -> None:
        ended, self._ended = self._ended, []
        if batch or ended:  # one callback: the ends are known before any consumer wakes up to its outputs
            on_ended = self._on_ended if ended else None
            self._loop.call_soon_threadsafe(_put_all, batch, ended, on_ended)  # type: ignore[union-attr]

    def _stop(self, engine: LLMEngine | None, reason: str) -> None:
        """Refuse new work, fail every live stream and every queued admission with `reason`."""
        with self._lock:
            self._unavailable_reason = self._unavailable_reason or reason
        for request_id in list(self._streams):
            if engine is not None:
                engine.abort_request(request_id)
            self.metrics.observe_finished("error")
        error = EngineUnavailableError(reason)
        streams = set(self._streams.values())
        self._ended.extend(self._streams)
        self._streams.clear()
        for command in self._take_commands(block=False):
            if isinstance(command, (AdmitCommand, EngineCall)):
                self._loop.call_soon_threadsafe(resolve, command.done, error)  # type: ignore[union-attr]
        self._deliver([(stream, error) for stream in streams])
        if engine is not None:
            engine.close()


def group_request_ids(request_id: str, num_prompts: int) -> list[str]:
    """The engine request ids of a group admitted as `request_id`: itself for one prompt, else `request_id-i`."""
    return [request_id] if num_prompts == 1 else [f"{request_id}-{i}" for i in range(num_prompts)]


def _put_all(batch: list[tuple[OutputStream, RequestOutput | BaseException]], ended: list[str],
             on_ended: Callable[[list[str]], object] | None) -> None:
    for stream, item in batch:
        stream.put(item)
    if on_ended is not None:
        on_ended(ended)
