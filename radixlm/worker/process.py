"""WorkerProcess: a `ModelWorker` in a child process, fed pickled steps over a pipe.

The engine sees the same interface (`info()`, `execute_model(step)`): each step's `SchedulerOutput` is pickled and
sent, the `ModelRunnerOutput` comes back pickled. Nothing else crosses, which is what a worker on another device
or host needs too. An exception in the child's step comes back and is raised in the engine (the forward failed).
"""

from __future__ import annotations

import multiprocessing
import pickle
from multiprocessing.connection import Connection
from pathlib import Path

from radixlm.config import CacheConfig, ModelConfig
from radixlm.core.step import ModelRunnerOutput, SchedulerOutput
from radixlm.worker.worker import ModelWorker, WorkerInfo


class _Failed:
    """The child's answer to a step that raised."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _serve(connection: Connection, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig) -> None:
    try:
        worker = ModelWorker(model_dir, model_config, cache_config)
        connection.send_bytes(pickle.dumps(worker.info()))
    except BaseException as error:
        connection.send_bytes(pickle.dumps(_Failed(error)))
        return
    while True:
        try:
            data = connection.recv_bytes()
        except EOFError:
            return
        if not data:
            return
        try:
            reply: object = worker.execute_model(pickle.loads(data))
        except Exception as error:
            reply = _Failed(error)
        try:
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # an exception that does not pickle
            payload = pickle.dumps(_Failed(RuntimeError(f"{type(error).__name__}: {error}")))
        connection.send_bytes(payload)


class WorkerProcess:
    """Start a worker process (spawned: no state inherited) and wait until its model is loaded."""

    def __init__(self, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, model_dir, model_config, cache_config),
                                        name="radixlm-worker", daemon=True)
        self._process.start()
        child.close()
        self._info: WorkerInfo = self._receive()  # type: ignore[assignment]
        self.last_step_bytes = 0  # the pickled size of the last step sent

    def info(self) -> WorkerInfo:
        return self._info

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput:
        data = pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)
        self.last_step_bytes = len(data)
        self._connection.send_bytes(data)
        return self._receive()  # type: ignore[return-value]

    def _receive(self) -> object:
        try:
            reply = pickle.loads(self._connection.recv_bytes())
        except EOFError:
            raise RuntimeError(f"the worker process exited (code {self._process.exitcode})") from None
        if isinstance(reply, _Failed):
            raise reply.error
        return reply

    def close(self) -> None:
        if self._process.is_alive():
            self._connection.send_bytes(b"")
            self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
        self._connection.close()
