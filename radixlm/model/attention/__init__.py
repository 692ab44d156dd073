"""Paged attention for transformers models: backends (`backend.py` the interface, `torch_backend.py` the reference,
`cpp_backend.py` the C++ kernel, with `prefill_kernel.py` for its prefill chunks), the choice between them
(`selection.py`), the K/V write they share (`kv_write.py`) and the function registered with transformers
(`interface.py`)."""

from radixlm.model.attention.backend import AttentionBackend, AttentionMetadata, ChunkRows
from radixlm.model.attention.interface import paged_attention, register_paged_attention
from radixlm.model.attention.selection import create_backend, resolve_backend

__all__ = ["AttentionBackend", "AttentionMetadata", "ChunkRows", "create_backend", "paged_attention",
           "register_paged_attention", "resolve_backend"]
