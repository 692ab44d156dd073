"""Per-step tensors: slots, contiguous runs read as slices, decode grouping."""

import torch

from radixlm.core.step import ScheduledChunk, SchedulerOutput
from radixlm.model.attention.backend import first_slot_if_contiguous
from radixlm.model.input_batch import InputBatch
from radixlm.model.kv_cache import PagedKVCache


def test_contiguity_detection():
    assert first_slot_if_contiguous([5, 6, 7], 10, 4) == 20
    assert first_slot_if_contiguous([5, 6, 9], 8, 4) == 20  # only the blocks the context uses count
    assert first_slot_if_contiguous([5, 6, 9], 9, 4) is None
    assert first_slot_if_contiguous([0, 2, 1, 3], 16, 4) is None  # right span, wrong order
    assert first_slot_if_contiguous([7], 3, 4) == 28


def test_slots_of_runs_and_scattered_tables_agree():
    cache = PagedKVCache(num_layers=1, num_blocks=16, block_size=4, num_kv_heads=1, head_dim=2,
                         dtype=torch.float32)
    output = SchedulerOutput(chunks=[
        ScheduledChunk("run", [1], 9, [3, 4, 5], num_sampled=1),
        ScheduledChunk("scattered", [1], 9, [3, 8, 5], num_sampled=1),
        ScheduledChunk("prefill-run", [1, 2, 3], 5, [10, 11], num_sampled=1),
        ScheduledChunk("prefill-scattered", [1, 2, 3], 5, [10, 2], num_sampled=1),
    ])
    batch = InputBatch.build(output.chunks, {c.request_id: c.new_block_ids for c in output.chunks}, cache)
    decode = batch.attn_metadata.decode
    assert decode.slots(0, None) == slice(12, 22)
    assert decode.slots(0, 4) == slice(18, 22)
    assert decode.slots(1, None).tolist() == [12, 13, 14, 15, 32, 33, 34, 35, 20, 21]
    run, scattered = batch.attn_metadata.prefills
    assert run.context_slots == slice(40, 48)
    assert scattered.context_slots.tolist() == [40, 41, 42, 43, 8, 9, 10, 11]
    assert batch.attn_metadata.slot_mapping.tolist() == [21, 21, 45, 46, 47, 9, 10, 11]
