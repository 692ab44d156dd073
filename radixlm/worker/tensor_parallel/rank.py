"""One tensor-parallel rank: join the group, load this rank's shard, then run every step the engine schedules.

Rank 0 (the driver) is the engine's worker process (`radixlm.worker.process.serve_steps`): it receives each step
from the engine, broadcasts it to the other ranks through torch.distributed, runs the forward and samples. The
other ranks (followers) receive the broadcast, run the same forward with sampling off, and answer nothing. The
driver broadcasts None when the engine closes it, which ends every follower's loop.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import torch

from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig
from radixlm.core.step import ModelRunnerOutput, SchedulerOutput
from radixlm.model.device import resolve_device
from radixlm.structured.bitmask import GrammarBitmask
from radixlm.worker.process import WorkerDiedError
from radixlm.worker.tensor_parallel.group import RankInfo, broadcast_object, join_group, leave_group
from radixlm.worker.worker import ModelWorker, WorkerInfo

logger = logging.getLogger(__name__)


def _load(info: RankInfo, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig) -> ModelWorker:
    # The process that started the ranks ends them; a Ctrl-C in the terminal reaches it, not the ranks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if model_config.num_threads is None:  # the node's ranks share its cores rather than each taking them all
        torch.set_num_threads(max(1, torch.get_num_threads() // info.local_world_size))
    join_group(info, resolve_device(model_config.device).type)  # NCCL on cuda, gloo on cpu
    return ModelWorker(model_dir, model_config, cache_config, info.world_size, samples=info.is_driver)


class DriverWorker:
    """Rank 0's worker: broadcasts each step to the followers, then runs it like any worker."""

    def __init__(self, info: RankInfo, model_dir: Path, model_config: ModelConfig,
                 cache_config: CacheConfig) -> None:
        self.worker = _load(info, model_dir, model_config, cache_config)
        self.broken = False  # a collective failed: the group cannot be used again

    def info(self) -> WorkerInfo:
        return self.worker.info()

    def execute_model(self, step: SchedulerOutput, grammar_bitmask: GrammarBitmask | None = None) -> ModelRunnerOutput:
        """The step's output; WorkerDiedError when a collective fails (a peer rank is gone, maybe on another node:
        the group cannot run another step), so the engine stops instead of counting a failed forward."""
        try:
            broadcast_object((step, grammar_bitmask))
            return self.worker.execute_model(step, grammar_bitmask)
        except Exception as error:
            if not _is_collective_error(error):
                raise
            self.broken = True
            raise WorkerDiedError(f"the tensor-parallel group failed (a rank exited?): {error}") from None

    def close(self) -> None:
        if not self.broken:
            broadcast_object(None)
        leave_group()


def _is_collective_error(error: Exception) -> bool:
    """A failure of the process group (a peer's connection closed, a timeout), not of this rank's computation."""
    return isinstance(error, torch.distributed.DistError) or any(
        backend in str(error) for backend in ("gloo", "NCCL", "Connection reset", "Connection closed"))


def run_follower(info: RankInfo, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig) -> None:
    """A follower rank's process: steps from the driver until it broadcasts None."""
    worker = _load(info, model_dir, model_config, cache_config)
    while True:
        work = broadcast_object(None)
        if work is None:
            break
        try:
            worker.execute_model(*work)  # type: ignore[misc]
        except Exception:  # the driver fails the same forward and reports it; keep in step with it
            logger.exception("tensor-parallel rank %d: the forward failed", info.rank)
    leave_group()
