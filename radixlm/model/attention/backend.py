"""The attention backend interface: what the runner asks of a way of computing paged attention.

A backend does two things. Once per forward, `build_metadata` turns the step's layout (one `ChunkRows` per scheduled
chunk, from `radixlm.model.input_batch.InputBatch.build`) into the metadata its layers need (block tables, slot
lists, masks: whatever it reads). In every attention layer, `forward` writes the new K/V into the paged cache and
attends. The metadata carries the backend that built it, so the function registered with transformers
(`interface.paged_attention`) only hands each layer to `metadata.backend.forward`, and nothing is global.

A new backend (another kernel, another KV format) is one subclass with its own metadata; `selection.py` names it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

import torch

from radixlm.core.block_pool import cdiv

if TYPE_CHECKING:
    from radixlm.model.kv_cache import PagedKVCache


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """One scheduled chunk's place in a packed `[1, T]` forward: its query rows are `first_row ..
    first_row + num_tokens - 1`, holding positions `start_position .. context_len - 1` of its request."""

    first_row: int
    start_position: int
    context_len: int  # positions 0 .. context_len - 1 are attended after this step's K/V are written
    num_sampled: int  # its last rows whose logits are sampled (all of them: a decode, or one verifying drafts)
    block_table: list[int]  # its request's blocks, covering the context
    block_size: int

    @property
    def num_tokens(self) -> int:
        return self.context_len - self.start_position

    @property
    def context_slots(self) -> slice | torch.Tensor:
        """Slots of positions 0 .. context_len - 1 on the host: a slice of the cache when they are one run of blocks,
        else an int64 tensor to gather. Computed on each read: the C++ backend's decode rows read block tables, and
        listing a shared prefix's 1,100 slots for each of 32 such rows cost 2 ms a step."""
        first = first_slot_if_contiguous(self.block_table, self.context_len, self.block_size)
        if first is not None:
            return slice(first, first + self.context_len)
        positions = torch.arange(self.context_len)
        blocks = torch.tensor(self.block_table[:cdiv(self.context_len, self.block_size)], dtype=torch.long)
        return blocks[positions // self.block_size] * self.block_size + positions % self.block_size

    def new_slots(self) -> range | list[int]:
        """The slots this chunk's positions start_position .. context_len - 1 write their K/V to."""
        first = first_slot_if_contiguous(self.block_table, self.context_len, self.block_size)
        if first is not None:
            return range(first + self.start_position, first + self.context_len)
        size, table = self.block_size, self.block_table
        return [table[position // size] * size + position % size
                for position in range(self.start_position, self.context_len)]


def first_slot_if_contiguous(block_table: list[int], context_len: int, block_size: int) -> int | None:
    """Slot of position 0 when positions 0..context_len-1 live in one run of consecutive blocks (then their K/V
    are one slice of the cache and attention reads them without a gather; see BlockPool)."""
    num_blocks = cdiv(context_len, block_size)
    first = block_table[0]
    if block_table[:num_blocks] != list(range(first, first + num_blocks)):  # compared in C
        return None
    return first * block_size


@dataclass
class AttentionMetadata:
    """What every attention layer of one forward shares, built by `backend.build_metadata`. It travels as the
    `radix_attn` keyword of `model(...)`: transformers passes extra keywords through to every attention layer."""

    backend: AttentionBackend
    kv_cache: PagedKVCache
    slot_mapping: torch.Tensor  # [T] int64, on the cache's device: where each new token's K/V are written


MetadataT = TypeVar("MetadataT", bound=AttentionMetadata)


class AttentionBackend(ABC, Generic[MetadataT]):
    """One way of computing paged attention over a `PagedKVCache`; stateless between forwards."""

    name: ClassVar[str]  # its `--attention-backend` value
    # Whether the model's other C++ kernels (small-batch and GGUF linears, norms, rotary) run beside this backend:
    # the torch backend is the all-PyTorch reference, so it turns them off.
    runs_cpp_kernels: ClassVar[bool]

    @abstractmethod
    def build_metadata(self, chunks: Sequence[ChunkRows], kv_cache: PagedKVCache,
                       slot_mapping: torch.Tensor) -> MetadataT:
        """The metadata of one forward over `chunks` (in row order, covering every row once); `slot_mapping` is
        already on the cache's device, anything built here that the layers read goes there too."""

    @abstractmethod
    def forward(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: MetadataT,
                scaling: float | None, sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        """Attention layer `layer`: write the new key/value `[1, Hkv, T, D]` (any strides) at
        `metadata.slot_mapping`, then attend query `[1, Hq, T, D]` (RoPE applied) over each row's context, its
        last `sliding_window` positions when set, logits scaled by `scaling` (`D ** -0.5` when None) and soft-capped
        as `tanh(x / softcap) * softcap` when set. Returns `[1, T, Hq, D]` in the query's dtype."""
