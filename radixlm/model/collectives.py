"""The collectives the model layer needs across tensor-parallel ranks besides transformers' own (a no-op without a
process group: one rank, or no tensor parallelism). The group itself is joined by the worker
(`radixlm/worker/tensor_parallel/group.py`)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def agree_min(value: int) -> int:
    """The smallest `value` over the group (e.g. KV blocks: every rank must hold the blocks the scheduler uses)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())
