"""Which attention backend runs: `--attention-backend auto|cpp|torch` on a device, and the backend objects."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from radixlm.config import ATTENTION_BACKENDS
from radixlm.model.attention.backend import AttentionBackend
from radixlm.model.attention.cpp_backend import CppAttentionBackend
from radixlm.model.attention.torch_backend import TorchAttentionBackend
from radixlm.model.ops import extension_error

logger = logging.getLogger(__name__)

_CPU = torch.device("cpu")
# Every backend by its `--attention-backend` name ("auto" picks one of them).
_BACKENDS: Mapping[str, Callable[[], AttentionBackend]] = MappingProxyType({
    CppAttentionBackend.name: CppAttentionBackend,
    TorchAttentionBackend.name: TorchAttentionBackend,
})


def resolve_backend(requested: str, device: torch.device = _CPU) -> str:
    """The backend name `--attention-backend requested` runs on `device`. On the CPU, auto takes cpp when the
    extension imports, else torch with a warning; an explicit cpp without the extension is a ValueError. The C++
    kernel is CPU code: elsewhere auto is torch and cpp a ValueError. An unknown name is a ValueError."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    if device.type != "cpu":
        if requested == "cpp":
            raise ValueError(f"attention_backend 'cpp' is a CPU kernel; on {device.type} use 'torch' or 'auto'")
        return TorchAttentionBackend.name
    if requested == TorchAttentionBackend.name:
        return requested
    error = extension_error()
    if error is None:
        return CppAttentionBackend.name
    if requested == CppAttentionBackend.name:
        raise ValueError(f"attention_backend 'cpp' needs the radixlm._C extension (scripts/install.sh): {error}")
    logger.warning("radixlm._C is not built (%s); using the torch attention path", error)
    return TorchAttentionBackend.name


def create_backend(name: str) -> AttentionBackend:
    """A new backend object of a name `resolve_backend` returns."""
    return _BACKENDS[name]()
