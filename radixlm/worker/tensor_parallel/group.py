"""The tensor-parallel process group: where each rank sits, how the group is joined, and the step broadcast the
engine's ranks need besides the model's own collectives (`radixlm/model/collectives.py`).

Launched like torchrun: every rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and joins one
group (gloo on CPU, NCCL on CUDA). transformers' tensor-parallel loading finds the group already initialized.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a rank waits in a collective for the others. The followers wait in a broadcast for the next step for as
# long as the server is idle, so this must not be short (gloo's default, 30 minutes, would end an idle server).
# A dead local rank is found by the engine's liveness polling, a dead remote one by its closed connections.
COLLECTIVE_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the tensor-parallel group; rank 0 talks to the engine and samples."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # ranks on this node
    master_addr: str
    master_port: int

    @property
    def is_driver(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous(dist_init_addr: str | None) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT): `host:port` as given, or a free port on this machine."""
    if dist_init_addr is None:
        return "127.0.0.1", free_port()
    host, _, port = dist_init_addr.rpartition(":")
    return host.strip("[]"), int(port)


def node_ranks(tensor_parallel_size: int, nnodes: int, node_rank: int) -> range:
    """The global ranks one node runs: node k runs ranks k * N / nnodes .. (k + 1) * N / nnodes - 1."""
    per_node = tensor_parallel_size // nnodes
    return range(node_rank * per_node, (node_rank + 1) * per_node)


def join_group(info: RankInfo, device: str = "cpu") -> None:
    """Set the torchrun environment and join the group; returns once every rank has joined."""
    os.environ.update(RANK=str(info.rank), LOCAL_RANK=str(info.local_rank), WORLD_SIZE=str(info.world_size),
                      LOCAL_WORLD_SIZE=str(info.local_world_size), MASTER_ADDR=info.master_addr,
                      MASTER_PORT=str(info.master_port))
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend, rank=info.rank, world_size=info.world_size, timeout=COLLECTIVE_TIMEOUT,
                            init_method=f"tcp://{info.master_addr}:{info.master_port}")


def broadcast_object(value: object | None) -> object:
    """Rank 0's `value` on every rank (the step input; None tells the ranks to stop)."""
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
