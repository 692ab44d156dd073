"""InputBatch: the tensors of one packed forward, built from a SchedulerOutput.

All scheduled tokens of all requests (the chunks of a SchedulerOutput, with the block tables the worker keeps) form
one `[1, T]` sequence. Per token: its id, its position in its own request, and the slot its K/V are written to. Per
chunk: its rows and its block table (`ChunkRows`, which lists its context's slots for a backend that reads them: a
slice of the cache when the context is one run of blocks, the usual case, see BlockPool; otherwise the slot of every
position, to gather), from which the attention backend builds the forward's attention metadata.

The rows whose logits the LM head computes (`logits_to_keep`) are the sampled rows (the last `num_sampled`
positions of each sampling chunk, chunk by chunk), then the prompt rows asked for prompt logprobs, request by request.

With LoRA adapters, the chunks are packed grouped by adapter (the base model's first, then by adapter id; chunk
order kept within a group), so that each adapter's rows are one run (`lora_groups`); the logits rows still come in
the chunks' own order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from radixlm.core.step import ScheduledChunk
from radixlm.model.attention.backend import AttentionBackend, AttentionMetadata, ChunkRows
from radixlm.model.attention.torch_backend import TorchAttentionBackend
from radixlm.model.device import to_device
from radixlm.model.kv_cache import PagedKVCache
from radixlm.model.lora.linear import RowGroup


@dataclass
class InputBatch:
    input_ids: torch.Tensor      # [1, T]
    position_ids: torch.Tensor   # [1, T]
    logits_indices: torch.Tensor  # [S + X] sampled rows (chunk order), then the extra prompt rows
    attn_metadata: AttentionMetadata
    num_sampled_rows: int = 0  # S
    extra_rows: dict[str, slice] = field(default_factory=dict)  # request id -> its slice of the logits after S
    first_rows: list[int] = field(default_factory=list)  # per chunk, in the chunks' order: its first row
    lora_groups: tuple[RowGroup, ...] = ()  # the rows of each adapter (none: every row runs the base model)

    @classmethod
    def build(cls, chunks: Sequence[ScheduledChunk], block_tables: Mapping[str, list[int]], kv_cache: PagedKVCache,
              extra_logits_positions: Mapping[str, tuple[int, int]] | None = None,
              attention: AttentionBackend | None = None, lora_ids: Mapping[str, int] | None = None) -> InputBatch:
        """`block_tables[request_id]`: the blocks of each chunk's request, covering its context.
        `extra_logits_positions[request_id] = (first, end)`: also compute the logits of positions
        `first .. end - 1` of that request, which must lie in its chunk (prompt logprobs). `attention` builds the
        attention metadata (the torch reference when None). `lora_ids[request_id]`: the adapter of each adapted
        request (the others run the base model). The tensors are built on the host and placed on the KV cache's
        device."""
        block_size = kv_cache.block_size
        device = kv_cache.device
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []  # where each new token's K/V go
        extra_logits_rows: list[int] = []
        extra_rows: dict[str, slice] = {}
        layout: list[ChunkRows] = []
        sampled_rows: list[range] = [range(0)] * len(chunks)  # per chunk, in the chunks' order
        first_rows = [0] * len(chunks)
        groups: list[RowGroup] = []
        for index in _packing_order(chunks, lora_ids):
            chunk = chunks[index]
            chunk_row = first_rows[index] = len(token_ids)
            start, context_len = chunk.start_position, chunk.context_len
            block_table = block_tables[chunk.request_id]
            token_ids.extend(chunk.token_ids)
            positions.extend(range(start, context_len))
            rows = ChunkRows(chunk_row, start, context_len, chunk.num_sampled, block_table, block_size)
            slots.extend(rows.new_slots())
            layout.append(rows)
            sampled_rows[index] = range(len(token_ids) - chunk.num_sampled, len(token_ids))
            lora_id = lora_ids.get(chunk.request_id, 0) if lora_ids else 0
            if lora_id:
                if groups and groups[-1].lora_id == lora_id:
                    groups[-1] = RowGroup(lora_id, groups[-1].start, len(token_ids))
                else:
                    groups.append(RowGroup(lora_id, chunk_row, len(token_ids)))
            if extra_logits_positions and chunk.request_id in extra_logits_positions:
                first, end = extra_logits_positions[chunk.request_id]
                assert start <= first <= end <= context_len, (chunk, first, end)
                extra_rows[chunk.request_id] = slice(len(extra_logits_rows), len(extra_logits_rows) + end - first)
                extra_logits_rows.extend(range(chunk_row + first - start, chunk_row + end - start))
        logits_rows = [row for rows in sampled_rows for row in rows]
        attention = attention if attention is not None else TorchAttentionBackend()
        metadata = attention.build_metadata(layout, kv_cache,
                                            to_device(torch.tensor(slots, dtype=torch.long), device))
        position_tensor = to_device(torch.tensor(positions, dtype=torch.long), device)
        return cls(input_ids=to_device(torch.tensor([token_ids], dtype=torch.long), device),
                   position_ids=position_tensor[None],
                   logits_indices=to_device(torch.tensor(logits_rows + extra_logits_rows, dtype=torch.long), device),
                   attn_metadata=metadata, num_sampled_rows=len(logits_rows), extra_rows=extra_rows,
                   first_rows=first_rows, lora_groups=tuple(groups))


def _packing_order(chunks: Sequence[ScheduledChunk], lora_ids: Mapping[str, int] | None) -> list[int]:
    """The chunks' indices in packing order: grouped by adapter when some run one (see the module docstring)."""
    order = list(range(len(chunks)))
    if lora_ids:
        order.sort(key=lambda index: lora_ids.get(chunks[index].request_id, 0))
    return order
