"""Where the model runs: `--device` and `--dtype auto` resolved against what torch sees, and the one host-to-device
copy per step tensor.

Step inputs are built on the host (Python lists -> CPU tensors) and copied once per step; on CUDA they go through
pinned memory so the copy is asynchronous. On CPU nothing is copied.
"""

from __future__ import annotations

import ctypes

import torch

# glibc's mallopt parameters
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def resolve_device(requested: str) -> torch.device:
    """`auto` -> cuda when torch sees a GPU, else cpu; an explicit `cuda` without one is a ValueError."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device "
                         f"(torch {torch.__version__}, built {'with' if torch.version.cuda else 'without'} CUDA)")
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"device must be one of auto, cpu, cuda, got {requested!r}")
    return torch.device(requested)


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """`auto` -> bfloat16 on CUDA, float32 on CPU (where bfloat16 matmuls are slower and less exact)."""
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, requested)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: itself on CPU, an asynchronous copy from pinned memory on CUDA."""
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def keep_freed_host_memory() -> bool:
    """Ask glibc to serve large host allocations from its heap and to keep what is freed there, so a step's big
    temporaries (a prefill chunk's MLP activations: tens of MB each) reuse memory instead of mapping fresh pages.
    Every fresh page costs a fault (and in a VM an exit to the host): a 1B model's 2,048-token prefill spent 1.4 of
    15.7 s in them. Call it once the weights and KV cache are allocated, so freed loading buffers are not kept.
    False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1))
    except (OSError, AttributeError):
        return False
