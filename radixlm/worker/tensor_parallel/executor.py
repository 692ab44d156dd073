"""TensorParallelExecutor: the engine's worker when `--tensor-parallel-size` > 1 (the `WorkerProcess` interface).

It starts this node's ranks (`worker/launch.py`): rank 0 is a `WorkerProcess` whose worker is the driver
(`rank.DriverWorker`), the other local ranks are plain processes (`rank.run_follower`). Ranks on other nodes are
started there by `radixlm serve --node-rank K` (`run_node`). While the engine waits for rank 0, every local rank's
liveness is polled: a rank that dies raises `WorkerDiedError` naming it within a fraction of a second, and the others
are stopped, because a gloo collective with a dead peer may wait for minutes.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import signal
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path

from transformers import AutoConfig

from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig, ParallelConfig
from radixlm.model.sharding import check_tensor_parallel
from radixlm.worker.launch import start_process
from radixlm.worker.process import WorkerProcess
from radixlm.worker.tensor_parallel.group import RankInfo, node_ranks, rendezvous
from radixlm.worker.tensor_parallel.rank import DriverWorker, run_follower

logger = logging.getLogger(__name__)


def _start_followers(ranks: range, parallel: ParallelConfig, addr: str, port: int, model_dir: Path,
                     model_config: ModelConfig, cache_config: CacheConfig) -> list[tuple[int, BaseProcess]]:
    followers = []
    for local_rank, rank in enumerate(ranks):
        if rank == 0:
            continue
        info = RankInfo(rank, parallel.tensor_parallel_size, local_rank, len(ranks), addr, port)
        process = start_process(run_follower, (info, model_dir, model_config, cache_config), f"radixlm-tp-rank-{rank}")
        logger.info("tensor-parallel rank %d started (pid %d)", rank, process.pid)
        followers.append((rank, process))
    return followers


class TensorParallelExecutor(WorkerProcess):
    """Node 0's ranks; the engine talks to rank 0 only."""

    def __init__(self, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig,
                 parallel: ParallelConfig) -> None:
        # A model that cannot be sharded fails here, before any process starts.
        check_tensor_parallel(AutoConfig.from_pretrained(model_dir), parallel.tensor_parallel_size,
                              model_config.quantization)
        addr, port = rendezvous(parallel.dist_init_addr)
        ranks = node_ranks(parallel.tensor_parallel_size, parallel.nnodes, 0)
        self._followers = _start_followers(ranks, parallel, addr, port, model_dir, model_config, cache_config)
        driver = RankInfo(0, parallel.tensor_parallel_size, 0, len(ranks), addr, port)
        try:
            self._start(DriverWorker, (driver, model_dir, model_config, cache_config), name="radixlm-tp-rank-0")
        except BaseException:  # the followers may wait for rank 0 in a collective: stop them now
            if hasattr(self, "_connection"):
                self.kill()
            else:
                self._stop_followers(timeout=0)
            raise
        logger.info("tensor-parallel rank 0 started (pid %d); %d ranks on %d node(s), rendezvous %s:%d",
                    self._process.pid, parallel.tensor_parallel_size, parallel.nnodes, addr, port)

    def watched(self) -> list[tuple[str, BaseProcess]]:
        return [("tensor-parallel rank 0", self._process)] + [
            (f"tensor-parallel rank {rank}", process) for rank, process in self._followers]

    def _settle(self, timeout: float = 1.0) -> None:
        """A rank's collective fails as soon as a peer's sockets close, which is a moment before that peer can be
        seen to have exited: wait up to `timeout` for a rank to exit, so the error names it. Its sentinel closes with
        its sockets, still a moment before it can be reaped, so a rank whose sentinel is ready is joined (a blocking
        wait for its exit code) rather than asked `is_alive()`, which could still answer yes."""
        processes = [process for _, process in self.watched()]
        ready = multiprocessing.connection.wait([process.sentinel for process in processes], timeout)
        for process in processes:
            if process.sentinel in ready:
                process.join(timeout)

    def close(self) -> None:
        if hasattr(self, "_process"):
            super().close()  # rank 0 broadcasts the end to the followers
        self._stop_followers()

    def kill(self) -> None:
        super().kill()
        self._stop_followers(timeout=0)

    def _stop_followers(self, timeout: float = 10.0) -> None:
        for _, process in self._followers:
            process.join(timeout=timeout if process.is_alive() else 0)
            if process.is_alive():
                process.kill()
                process.join(timeout=1)


def run_node(model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig, parallel: ParallelConfig) -> int:
    """Node `parallel.node_rank` (> 0): run this node's ranks until the group ends; returns an exit status (0 when
    every rank ended cleanly)."""
    addr, port = rendezvous(parallel.dist_init_addr)
    ranks = node_ranks(parallel.tensor_parallel_size, parallel.nnodes, parallel.node_rank)
    followers = _start_followers(ranks, parallel, addr, port, model_dir, model_config, cache_config)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwinds to the kill below
    status = 0
    try:
        for rank, process in followers:
            process.join()
            if process.exitcode:
                logger.error("tensor-parallel rank %d exited with code %s", rank, process.exitcode)
                status = 1
    finally:  # interrupted (Ctrl-C, SIGTERM): the ranks go too
        for _, process in followers:
            if process.is_alive():
                process.kill()
    return status
