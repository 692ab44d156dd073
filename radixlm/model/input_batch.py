"""InputBatch: the tensors of one packed forward, built from a SchedulerOutput.

All scheduled tokens of all requests (the chunks of a SchedulerOutput, with the block tables the worker keeps) form
one `[1, T]` sequence. Per token: its id, its position in its own
request, and the slot its K/V are written to. Per request: which query rows are its own and which slots hold its
context: a slice of the cache when the context is one run of blocks (the usual case, see BlockPool), otherwise the
slot of every position, to gather.

The rows whose logits the LM head computes (`logits_to_keep`) are the sampled rows (the last `num_sampled`
positions of each sampling chunk, chunk by chunk), then the prompt rows asked for prompt logprobs, request by request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from radixlm.core.block_pool import cdiv
from radixlm.core.step import ScheduledChunk
from radixlm.model.decode_kernel import DecodeTables
from radixlm.model.device import to_device
from radixlm.model.kv_cache import PagedKVCache

_HOST = torch.device("cpu")


@dataclass
class DecodeGroup:
    """Query rows that attend as decodes: one token of a request over its context (a request verifying drafts, or
    with the C++ kernel any chunk, has one row per position, each over the context up to it)."""

    query_rows: torch.Tensor     # [B] rows of the packed batch
    context_lens: list[int]      # [B]
    contexts: list[slice | torch.Tensor]  # [B] slots of positions 0..L-1 (a slice when they are one run); empty
    # when `tables` is set (the kernel reads the block tables instead)
    rows_are_prefix: bool        # query_rows == arange(B): slice instead of gather
    tables: DecodeTables | None = None  # the C++ kernel's block tables (only when that backend runs)
    _windowed: dict[int | None, list[slice | torch.Tensor]] = field(default_factory=dict)

    def slots(self, index: int, sliding_window: int | None) -> torch.Tensor | slice:
        """Slots request `index` attends to (its whole context, or the last `sliding_window` positions): a slice
        of the cache when they are contiguous, else a tensor of slot indices to gather."""
        return self.all_slots(sliding_window)[index]

    def all_slots(self, sliding_window: int | None) -> list[slice | torch.Tensor]:
        """`slots(i, sliding_window)` for every request, computed once per step (every layer reads them)."""
        if sliding_window not in self._windowed:
            self._windowed[sliding_window] = [_window(context, length, sliding_window)
                                              for context, length in zip(self.contexts, self.context_lens, strict=True)]
        return self._windowed[sliding_window]


def _window(context: slice | torch.Tensor, length: int, sliding_window: int | None) -> slice | torch.Tensor:
    if sliding_window is None or sliding_window >= length:
        return context
    if isinstance(context, slice):
        return slice(context.stop - sliding_window, context.stop)
    return context[length - sliding_window:]


@dataclass
class PrefillSegment:
    """One request computing several tokens: query rows `start .. start + num_queries - 1`."""

    start: int
    num_queries: int
    context_slots: torch.Tensor | slice | None  # positions 0..L-1 (a slice when contiguous); None: the chunk is all
    context_len: int
    device: torch.device = _HOST  # where the masks go (the cache's device)
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
                self._masks[sliding_window] = to_device(allowed, self.device)
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
    logits_indices: torch.Tensor  # [S + X] sampled rows (chunk order), then the extra prompt rows
    attn_metadata: AttentionMetadata
    num_sampled_rows: int = 0  # S
    extra_rows: dict[str, slice] = field(default_factory=dict)  # request id -> its slice of the logits after S

    @classmethod
    def build(cls, chunks: Sequence[ScheduledChunk], block_tables: Mapping[str, list[int]], kv_cache: PagedKVCache,
              extra_logits_positions: Mapping[str, tuple[int, int]] | None = None,
              decode_kernel: bool = False) -> InputBatch:
        """`block_tables[request_id]`: the blocks of each chunk's request, covering its context.
        `extra_logits_positions[request_id] = (first, end)`: also compute the logits of positions
        `first .. end - 1` of that request, which must lie in its chunk (prompt logprobs). `decode_kernel`: every
        chunk's rows attend as decodes through the C++ kernel's block tables (else prefill chunks are SDPA
        segments, the torch reference). The tensors are built on the host and placed on the KV cache's device."""
        block_size = kv_cache.block_size
        device = kv_cache.device
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []  # where each new token's K/V go
        logits_rows: list[int] = []
        extra_logits_rows: list[int] = []
        extra_rows: dict[str, slice] = {}
        decode_rows: list[int] = []
        decode_lens: list[int] = []
        decode_contexts: list[slice | torch.Tensor] = []
        decode_tables: list[list[int]] = []
        prefills: list[PrefillSegment] = []
        for chunk in chunks:
            chunk_row = len(token_ids)
            start, context_len = chunk.start_position, chunk.context_len
            block_table = block_tables[chunk.request_id]
            token_ids.extend(chunk.token_ids)
            positions.extend(range(start, context_len))
            context = _context_slots(block_table, context_len, block_size)
            slots.extend(range(context.start + start, context.stop) if isinstance(context, slice)
                         else context[start:].tolist())
            context = context if isinstance(context, slice) else to_device(context, device)
            if chunk.num_tokens == chunk.num_sampled or decode_kernel:
                # A decode, one verifying drafts, or any chunk when the C++ kernel attends: each row attends like
                # the decode of its position would, so drafted tokens get exactly the numbers plain decoding gives
                # them, and with the kernel a token's numbers never depend on how its prompt was chunked, cached
                # or batched (the kernel reads a chunk's context once for all its rows).
                decode_rows.extend(range(chunk_row, chunk_row + chunk.num_tokens))
                decode_lens.extend(range(start + 1, context_len + 1))
                decode_tables.extend([block_table] * chunk.num_tokens)  # one object: the kernel shares it
                if not decode_kernel:  # the torch path reads each row's slots
                    decode_contexts.extend(_prefix(context, length) for length in range(start + 1, context_len))
                    decode_contexts.append(context)
            else:
                prefills.append(PrefillSegment(start=chunk_row, num_queries=chunk.num_tokens,
                                               context_slots=context if start > 0 else None, context_len=context_len,
                                               device=device))
            logits_rows.extend(range(len(token_ids) - chunk.num_sampled, len(token_ids)))
            if extra_logits_positions and chunk.request_id in extra_logits_positions:
                first, end = extra_logits_positions[chunk.request_id]
                assert start <= first <= end <= context_len, (chunk, first, end)
                extra_rows[chunk.request_id] = slice(len(extra_logits_rows), len(extra_logits_rows) + end - first)
                extra_logits_rows.extend(range(chunk_row + first - start, chunk_row + end - start))
        decode = DecodeGroup(query_rows=to_device(torch.tensor(decode_rows), device), context_lens=decode_lens,
                             contexts=decode_contexts,
                             rows_are_prefix=decode_rows == list(range(len(decode_rows))),
                             tables=DecodeTables.build(decode_tables, decode_lens, block_size) if decode_kernel
                             else None) if decode_rows else None
        metadata = AttentionMetadata(kv_cache=kv_cache, decode=decode, prefills=prefills,
                                     slot_mapping=to_device(torch.tensor(slots, dtype=torch.long), device))
        position_tensor = to_device(torch.tensor(positions, dtype=torch.long), device)
        return cls(input_ids=to_device(torch.tensor([token_ids], dtype=torch.long), device),
                   position_ids=position_tensor[None],
                   logits_indices=to_device(torch.tensor(logits_rows + extra_logits_rows, dtype=torch.long), device),
                   attn_metadata=metadata, num_sampled_rows=len(logits_rows), extra_rows=extra_rows)


def _prefix(context: slice | torch.Tensor, length: int) -> slice | torch.Tensor:
    """The slots of the first `length` positions of a context."""
    return slice(context.start, context.start + length) if isinstance(context, slice) else context[:length]


def _first_slot_if_contiguous(block_table: list[int], context_len: int, block_size: int) -> int | None:
    """Slot of position 0 when positions 0..context_len-1 live in one run of consecutive blocks (then their K/V
    are one slice of the cache and attention reads them without a gather; see BlockPool)."""
    num_blocks = cdiv(context_len, block_size)
    first = block_table[0]
    if block_table[:num_blocks] != list(range(first, first + num_blocks)):  # compared in C
        return None
    return first * block_size


def _context_slots(block_table: list[int], context_len: int, block_size: int) -> slice | torch.Tensor:
    """Slots of positions 0..context_len-1: a slice of the cache when they are one run, else a tensor to gather."""
    first = _first_slot_if_contiguous(block_table, context_len, block_size)
    if first is not None:
        return slice(first, first + context_len)
    positions = torch.arange(context_len)
    blocks = torch.tensor(block_table[:cdiv(context_len, block_size)], dtype=torch.long)
    return blocks[positions // block_size] * block_size + positions % block_size
