"""Where the model worker runs: in this process, in a child process, or as tensor-parallel ranks."""

from __future__ import annotations

from pathlib import Path

from radixlm.config import EngineConfig
from radixlm.worker.process import WorkerProcess
from radixlm.worker.worker import ModelWorker


def start_worker(model_dir: Path, config: EngineConfig) -> ModelWorker | WorkerProcess:
    """In this process (uni), in a child process (mp), or as tensor-parallel ranks (tensor_parallel_size > 1)."""
    if config.parallel.tensor_parallel_size > 1:
        from radixlm.worker.tensor_parallel.executor import TensorParallelExecutor

        return TensorParallelExecutor(model_dir, config.model, config.cache, config.parallel)
    if config.model.distributed_executor_backend == "mp":
        return WorkerProcess(model_dir, config.model, config.cache, config.lora.enabled)
    return ModelWorker(model_dir, config.model, config.cache, enable_lora=config.lora.enabled)
