"""InputBatch: the tensors of one packed forward, built from a SchedulerOutput.

All scheduled tokens of all requests form one `[1, T]` sequence. Per token: its id, its position in its own
request, and the slot its K/V are written to. Per request: which query rows are its own and which slots hold its
context: a slice of the cache when the context is one run of blocks (the usual case, see BlockPool), otherwise the
slot of every position, to gather.

The rows whose logits the LM head computes (`logits_to_keep`) are the sampled rows (one per sampling request, in
`SchedulerOutput.sampling_request_ids` order), then the prompt rows asked for prompt logprobs, request by request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from radixlm.core.block_pool import cdiv
from radixlm.core.outputs import SchedulerOutput
from radixlm.model.kv_cache import PagedKVCache


@dataclass
class DecodeGroup:
    """Requests computing one token each (decodes)."""

    query_rows: torch.Tensor     # [B] rows of the packed batch
    context_lens: list[int]      # [B]
    first_slots: list[int | None]  # [B] slot of position 0 when the whole context is one run of slots
    scattered_slots: dict[int, torch.Tensor]  # index -> slots of positions 0..L-1, for the other requests
    rows_are_prefix: bool        # query_rows == arange(B): slice instead of gather

    def slots(self, index: int, sliding_window: int | None) -> torch.Tensor | slice:
        """Slots request `index` attends to (its whole context, or the last `sliding_window` positions): a slice
        of the cache when they are contiguous, else a tensor of slot indices to gather."""
        length = self.context_lens[index]
        start = 0 if sliding_window is None else max(0, length - sliding_window)
        first = self.first_slots[index]
        if first is not None:
            return slice(first + start, first + length)
        return self.scattered_slots[index][start:length]


@dataclass
class PrefillSegment:
    """One request computing several tokens: query rows `start .. start + num_queries - 1`."""

    start: int
    num_queries: int
    context_slots: torch.Tensor | slice | None  # positions 0..L-1 (a slice when contiguous); None: the chunk is all
    context_len: int
    _masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    def mask(self, sliding_window: int | None) -> torch.Tensor | None:
        """Boolean [num_queries, L] causal (and windowed) mask; None means plain causal with L == num_queries."""
        if sliding_window not in self._masks:
            if self.context_len == self.num_queries and (sliding_window is None or
                                                         sliding_window >= self.context_len):
                self._masks[sliding_window] = None
            else:
                query_pos = torch.arange(self.context_len - self.num_queries, self.context_len)[:, None]
                key_pos = torch.arange(self.context_len)[None, :]
                allowed = key_pos <= query_pos
                if sliding_window is not None:
                    allowed &= key_pos > query_pos - sliding_window
                self._masks[sliding_window] = allowed
        return self._masks[sliding_window]


@dataclass
class AttentionMetadata:
    """What the paged attention function needs for one forward; passed as a `model(...)` keyword argument."""

    kv_cache: PagedKVCache
    slot_mapping: torch.Tensor  # [T] where each new token's K/V are written
    decode: DecodeGroup | None
    prefills: list[PrefillSegment]


@dataclass
class InputBatch:
    input_ids: torch.Tensor      # [1, T]
    position_ids: torch.Tensor   # [1, T]
    logits_indices: torch.Tensor  # [S + X] sampled rows (sampling_request_ids order), then the extra prompt rows
    attn_metadata: AttentionMetadata
    num_sampled_rows: int = 0  # S
    extra_rows: dict[str, slice] = field(default_factory=dict)  # request id -> its slice of the logits after S

    @classmethod
    def build(cls, output: SchedulerOutput, kv_cache: PagedKVCache,
              extra_logits_positions: Mapping[str, tuple[int, int]] | None = None) -> InputBatch:
        """`extra_logits_positions[request_id] = (first, end)`: also compute the logits of positions
        `first .. end - 1` of that request, which must lie in its chunk (prompt logprobs)."""
        block_size = kv_cache.block_size
        chunks = output.chunks
        max_blocks = max(len(chunk.block_table) for chunk in chunks)
        block_tables = torch.tensor([c.block_table + [0] * (max_blocks - len(c.block_table)) for c in chunks],
                                    dtype=torch.long)
        token_ids: list[int] = []
        positions: list[int] = []
        chunk_of_token: list[int] = []
        logits_rows: list[int] = []
        extra_logits_rows: list[int] = []
        extra_rows: dict[str, slice] = {}
        for index, chunk in enumerate(chunks):
            chunk_row = len(token_ids)
            token_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start_position, chunk.context_len))
            chunk_of_token.extend([index] * chunk.num_tokens)
            if chunk.samples:
                logits_rows.append(len(token_ids) - 1)
            if extra_logits_positions and chunk.request_id in extra_logits_positions:
                first, end = extra_logits_positions[chunk.request_id]
                assert chunk.start_position <= first <= end <= chunk.context_len, (chunk, first, end)
                extra_rows[chunk.request_id] = slice(len(extra_logits_rows), len(extra_logits_rows) + end - first)
                extra_logits_rows.extend(range(chunk_row + first - chunk.start_position,
                                               chunk_row + end - chunk.start_position))
        position_tensor = torch.tensor(positions, dtype=torch.long)
        token_blocks = block_tables[torch.tensor(chunk_of_token), position_tensor // block_size]
        slot_mapping = token_blocks * block_size + position_tensor % block_size
        metadata = AttentionMetadata(kv_cache=kv_cache, slot_mapping=slot_mapping,
                                     decode=_decode_group(output, block_tables, block_size),
                                     prefills=_prefill_segments(output, block_tables, block_size))
        return cls(input_ids=torch.tensor([token_ids], dtype=torch.long), position_ids=position_tensor[None],
                   logits_indices=torch.tensor(logits_rows + extra_logits_rows, dtype=torch.long),
                   attn_metadata=metadata, num_sampled_rows=len(logits_rows), extra_rows=extra_rows)


def _first_slot_if_contiguous(block_table: list[int], context_len: int, block_size: int) -> int | None:
    """Slot of position 0 when positions 0..context_len-1 live in one run of consecutive blocks (then their K/V
    are one slice of the cache and attention reads them without a gather; see BlockPool)."""
    num_blocks = cdiv(context_len, block_size)
    first = block_table[0]
    if block_table[num_blocks - 1] - first != num_blocks - 1:
        return None
    if any(block_table[i] != first + i for i in range(1, num_blocks - 1)):
        return None
    return first * block_size


def _context_slots(block_rows: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """Slots of positions 0..context_len-1 for block-table rows `[B, max_blocks]` -> `[B, context_len]`."""
    positions = torch.arange(context_len)
    return block_rows[:, positions // block_size] * block_size + positions % block_size


def _decode_group(output: SchedulerOutput, block_tables: torch.Tensor, block_size: int) -> DecodeGroup | None:
    rows, lens, first_slots = [], [], []
    scattered: dict[int, torch.Tensor] = {}
    row = 0
    for index, chunk in enumerate(output.chunks):
        if chunk.num_tokens == 1:
            first = _first_slot_if_contiguous(chunk.block_table, chunk.context_len, block_size)
            if first is None:
                scattered[len(rows)] = _context_slots(block_tables[index:index + 1], chunk.context_len,
                                                      block_size)[0]
            rows.append(row)
            lens.append(chunk.context_len)
            first_slots.append(first)
        row += chunk.num_tokens
    if not rows:
        return None
    return DecodeGroup(query_rows=torch.tensor(rows), context_lens=lens, first_slots=first_slots,
                       scattered_slots=scattered, rows_are_prefix=rows == list(range(len(rows))))


def _prefill_segments(output: SchedulerOutput, block_tables: torch.Tensor, block_size: int) -> list[PrefillSegment]:
    segments = []
    row = 0
    for index, chunk in enumerate(output.chunks):
        if chunk.num_tokens > 1:
            slots: torch.Tensor | slice | None = None
            if chunk.start_position > 0:
                first = _first_slot_if_contiguous(chunk.block_table, chunk.context_len, block_size)
                slots = slice(first, first + chunk.context_len) if first is not None else \
                    _context_slots(block_tables[index:index + 1], chunk.context_len, block_size)[0]
            segments.append(PrefillSegment(start=row, num_queries=chunk.num_tokens, context_slots=slots,
                                           context_len=chunk.context_len))
        row += chunk.num_tokens
    return segments
