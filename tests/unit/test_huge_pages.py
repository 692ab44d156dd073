"""HugePageArena: copies placed back to back in huge-page chunks, unchanged and cache-line aligned; parameters moved
into one with their ties kept."""

import pytest
import torch
from torch import nn

from radixlm.model.huge_pages import (
    HUGE_PAGE_BYTES,
    PLACEMENT_ALIGN,
    HugePageArena,
    huge_page_buffer,
    move_parameters,
)


def test_buffer_is_aligned_to_a_huge_page() -> None:
    buffer = huge_page_buffer(3 * 4096 + 5)
    assert buffer.numel() == 3 * 4096 + 5
    assert buffer.data_ptr() % HUGE_PAGE_BYTES == 0


def test_placed_copies_equal_their_tensors_and_start_on_cache_lines() -> None:
    arena = HugePageArena(chunk_bytes=HUGE_PAGE_BYTES)
    tensors = [torch.randint(0, 256, (7, 13), dtype=torch.uint8), torch.randn(5, 3), torch.randn(100).bfloat16()]
    placed = [arena.place(t) for t in tensors]
    for tensor, copy in zip(tensors, placed, strict=True):
        assert copy.dtype == tensor.dtype and copy.shape == tensor.shape and copy.is_contiguous()
        assert torch.equal(copy, tensor)
        assert copy.data_ptr() % PLACEMENT_ALIGN == 0
        assert copy.data_ptr() != tensor.data_ptr()
    assert arena.num_chunks == 1
    assert placed[1].data_ptr() - placed[0].data_ptr() == PLACEMENT_ALIGN * 2  # 91 bytes, rounded up to 128


def test_a_full_chunk_starts_another_and_a_large_tensor_gets_its_own() -> None:
    arena = HugePageArena(chunk_bytes=HUGE_PAGE_BYTES)
    first = arena.place(torch.zeros(HUGE_PAGE_BYTES - 64, dtype=torch.uint8))
    second = arena.place(torch.ones(128, dtype=torch.uint8))
    assert arena.num_chunks == 2
    large = arena.place(torch.full((3 * HUGE_PAGE_BYTES + 1,), 7, dtype=torch.uint8))
    assert arena.num_chunks == 3
    assert large.data_ptr() % HUGE_PAGE_BYTES == 0
    assert int(first.sum()) == 0 and int(second.sum()) == 128 and int(large[-1]) == 7


def test_chunk_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        HugePageArena(chunk_bytes=0)


def test_moved_parameters_keep_their_values_and_ties() -> None:
    embedding, head, other = nn.Embedding(40, 16), nn.Linear(16, 40, bias=False), nn.Linear(16, 8)
    head.weight = embedding.weight  # a tied LM head
    model = nn.ModuleDict({"embedding": embedding, "head": head, "other": other}).requires_grad_(False)
    before = {name: p.clone() for name, p in model.named_parameters(remove_duplicate=False)}
    old_head = head.weight
    arena = HugePageArena(chunk_bytes=HUGE_PAGE_BYTES)
    # The tied weight listed twice and a parameter the model does not hold: each moved once, the stranger not at all.
    assert move_parameters(model, iter([head.weight, embedding.weight, other.weight, torch.nn.Parameter(
        torch.zeros(3))]), arena) == 2
    assert head.weight is embedding.weight and head.weight is not old_head
    assert not head.weight.requires_grad
    chunk_start = head.weight.data_ptr() - head.weight.data_ptr() % HUGE_PAGE_BYTES
    assert other.weight.data_ptr() - chunk_start < HUGE_PAGE_BYTES  # both in the arena's one chunk
    for name, parameter in model.named_parameters(remove_duplicate=False):
        assert torch.equal(parameter, before[name])
