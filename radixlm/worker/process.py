"""WorkerProcess: a `ModelWorker` in a child process, fed pickled steps over a pipe.

The engine sees the same interface (`info()`, `execute_model(step, grammar_bitmask)`, `add_lora`, `remove_lora`):
each call is pickled as the method's name and its arguments (a step's `SchedulerOutput` with the grammar bitmask
beside it, or a checked LoRA adapter), and its result comes back pickled. Nothing else crosses, which is what a
worker on another device or host needs too. An exception in the child's call comes back and is raised in the
engine (the forward failed, or the adapter did not load).

A child that dies is noticed while the engine waits for it: `WorkerDiedError` (the engine cannot go on), never a
hang. `check_health()` lets an idle engine notice it too. Subclasses watch more processes (tensor-parallel ranks).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig
from radixlm.core.step import ModelRunnerOutput, SchedulerOutput
from radixlm.model.lora.adapter_file import AdapterFile
from radixlm.structured.bitmask import GrammarBitmask
from radixlm.worker.launch import start_process
from radixlm.worker.worker import ModelWorker, WorkerInfo

POLL_SECONDS = 0.2  # how often a waiting engine checks that its processes are alive


class WorkerDiedError(RuntimeError):
    """A worker process (or a tensor-parallel rank) exited: the engine cannot run another step."""


# What the engine may call on a worker in another process.
WORKER_METHODS = frozenset({"execute_model", "add_lora", "remove_lora"})


class StepWorker(Protocol):
    def info(self) -> WorkerInfo: ...

    def execute_model(self, step: SchedulerOutput, grammar_bitmask: GrammarBitmask | None = None,
                      ) -> ModelRunnerOutput: ...


class _Failed:
    """The child's answer to a step that raised."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def serve_steps(connection: Connection, make_worker: Callable[..., StepWorker], *args: Any) -> None:
    """The child's loop: build the worker, send its info, then answer each step until the pipe closes (or an
    empty message); `close()` is called on the worker if it has one."""
    try:
        worker = make_worker(*args)
        connection.send_bytes(pickle.dumps(worker.info()))
    except BaseException as error:
        connection.send_bytes(pickle.dumps(_Failed(error)))
        return
    try:
        _answer_steps(connection, worker)
    finally:
        close = getattr(worker, "close", None)
        if close is not None:
            close()


def _answer_steps(connection: Connection, worker: StepWorker) -> None:
    while True:
        try:
            data = connection.recv_bytes()
        except EOFError:
            return
        if not data:
            return
        try:
            method, args = pickle.loads(data)
            if method not in WORKER_METHODS:
                raise ValueError(f"a worker has no method {method!r}")
            reply: object = getattr(worker, method)(*args)
        except Exception as error:
            reply = _Failed(error)
        try:
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # an exception that does not pickle
            payload = pickle.dumps(_Failed(RuntimeError(f"{type(error).__name__}: {error}")))
        connection.send_bytes(payload)


class WorkerProcess:
    """Start a worker process (`radixlm.worker.launch`: no state inherited) and wait until its model is loaded."""

    def __init__(self, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig,
                 enable_lora: bool = False) -> None:
        self._start(ModelWorker, (model_dir, model_config, cache_config, 1, True, enable_lora), name="radixlm-worker")

    def _start(self, make_worker: Callable[..., StepWorker], args: tuple[Any, ...], name: str) -> None:
        self._connection, child = multiprocessing.Pipe()
        self._process = start_process(serve_steps, (child, make_worker, *args), name)
        child.close()
        self._info: WorkerInfo = self._receive()  # type: ignore[assignment]
        self.last_step_bytes = 0  # the pickled size of the last step sent

    def info(self) -> WorkerInfo:
        return self._info

    def execute_model(self, step: SchedulerOutput, grammar_bitmask: GrammarBitmask | None = None) -> ModelRunnerOutput:
        return self._call("execute_model", step, grammar_bitmask)  # type: ignore[return-value]

    def add_lora(self, lora_id: int, adapter: AdapterFile) -> None:
        self._call("add_lora", lora_id, adapter)

    def remove_lora(self, lora_id: int) -> None:
        self._call("remove_lora", lora_id)

    def _call(self, method: str, *args: Any) -> object:
        self.check_health()
        data = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
        self.last_step_bytes = len(data)
        try:
            self._connection.send_bytes(data)
        except OSError:
            self.check_health()
            raise WorkerDiedError(self._death(self._process)) from None
        return self._receive()

    def watched(self) -> list[tuple[str, BaseProcess]]:
        """(name, process) of every process a step needs, checked while waiting."""
        return [("the worker process", self._process)]

    def check_health(self) -> None:
        """Raise WorkerDiedError naming the first watched process that is no longer alive (and stop the rest)."""
        for name, process in self.watched():
            if not process.is_alive():
                self.kill()
                raise WorkerDiedError(self._death(process, name))

    def _settle(self) -> None:
        """After a failed step, before telling why: give a dying process time to be seen dead (none here)."""

    def kill(self) -> None:
        """Stop every watched process now (no goodbye: a peer may be dead)."""
        for _, process in self.watched():
            if process.is_alive():
                process.kill()
        for _, process in self.watched():
            process.join(timeout=1)
        self._connection.close()

    @staticmethod
    def _death(process: BaseProcess, name: str = "the worker process") -> str:
        return f"{name} (pid {process.pid}) exited with code {process.exitcode}"

    def _receive(self) -> object:
        while not self._connection.poll(POLL_SECONDS):
            self.check_health()
        try:
            reply = pickle.loads(self._connection.recv_bytes())
        except EOFError:
            self._process.join(timeout=1)  # reap it, so its exit code is known
            self.check_health()
            raise WorkerDiedError(self._death(self._process)) from None
        if isinstance(reply, _Failed):
            self._settle()
            self.check_health()  # a collective fails when a peer dies: name the dead one
            if isinstance(reply.error, WorkerDiedError):  # the worker cannot go on (e.g. a remote rank is gone)
                self.kill()
            raise reply.error
        return reply

    def close(self) -> None:
        """Ask the worker to stop and wait for it (10 s at most, then it is killed)."""
        if self._connection.closed:
            return
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._connection.send_bytes(b"")
            self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
        self._connection.close()
