"""A bfloat16 model's queries and new K/V rows go into the decode kernel and `write_kv` as they are. Over a float32
cache they get what their float32 values get; over a bfloat16 cache on a CPU with AVX-512 BF16 the kernel scores
and weighs on the bfloat16 dot product (probabilities rounded to bfloat16), so the outputs stay within bfloat16's
precision of the float32 path, and each request's numbers still do not depend on the rest of the batch."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.model.attention.cpp_backend import DecodeTables, paged_decode_attention
from radixlm.model.attention.kv_write import write_kv
from radixlm.model.ops import extension_error
from tests.unit.test_decode_kernel import NUM_KV_HEADS, REQUEST_MIXES, WRITE_MIXES, _layer, _mix_tables

pytestmark = pytest.mark.skipif(extension_error() is not None,
                                reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")


def _caches(num_slots: int, head_dim: int, kv_dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [torch.randn(num_slots, NUM_KV_HEADS, head_dim).to(kv_dtype) for _ in range(2)]


def _attend(query: torch.Tensor, caches: list[torch.Tensor], tables: list[list[int]], lengths: list[int],
            block_size: int, num_threads: int = 2, sliding_window: int | None = None,
            softcap: float | None = None,
            new_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The kernel on `num_threads` threads (given `new_rows`, (slot_mapping, keys, values), it writes them first)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        return paged_decode_attention(query, _layer(caches), DecodeTables.build(tables, lengths, block_size),
                                      query.shape[-1] ** -0.5, sliding_window, softcap, new_rows)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("requests", WRITE_MIXES)
def test_bfloat16_queries_and_rows_get_what_their_float32_values_get(requests, kv_dtype):
    """A bfloat16 model's query and new K/V go in as they are (no conversion around the op): the caches are those
    of the same values in float32; the output is theirs rounded to bfloat16 once over a float32 cache, and within
    bfloat16's precision of it over a bfloat16 cache (the dot-product path, where the CPU has it)."""
    block_size, head_dim, num_heads = 16, 64, 3 * NUM_KV_HEADS
    lengths, tables, _ = _mix_tables(requests, 800, block_size, random.Random(len(requests)))
    slot_mapping = torch.tensor([table[(n - 1) // block_size] * block_size + (n - 1) % block_size
                                 for n, table in zip(lengths, tables, strict=True)])
    caches = _caches(800 * block_size, head_dim, kv_dtype, 5)
    query = torch.randn(len(lengths), num_heads, head_dim).bfloat16()
    keys, values = (torch.randn(NUM_KV_HEADS, len(lengths), head_dim).bfloat16().transpose(0, 1) for _ in range(2))
    decode_tables = DecodeTables.build(tables, lengths, block_size)
    as_float = [c.clone() for c in caches]
    expected = paged_decode_attention(query.float(), _layer(as_float), decode_tables, head_dim ** -0.5, None, None,
                                      (slot_mapping, keys.float(), values.float()))
    out = paged_decode_attention(query, _layer(caches), decode_tables, head_dim ** -0.5, None, None,
                                 (slot_mapping, keys, values))
    assert out.dtype == torch.bfloat16
    if kv_dtype == torch.float32:
        assert torch.equal(out, expected.bfloat16())
    else:
        torch.testing.assert_close(out.float(), expected, atol=4e-3, rtol=1e-2)
    assert torch.equal(caches[0], as_float[0]) and torch.equal(caches[1], as_float[1])
    written = [c.clone() for c in caches]
    write_kv(_layer(written), slot_mapping, keys, values)  # the C++ write_kv takes bfloat16 rows too
    assert torch.equal(written[0], caches[0]) and torch.equal(written[1], caches[1])


@pytest.mark.parametrize("head_dim", [64, 128, 80])  # 80: not whole 32-element pairs, the float32 phases
@pytest.mark.parametrize("rep", [1, 3, 4])
@pytest.mark.parametrize(("sliding_window", "softcap"), [(None, None), (40, None), (None, 30.0)])
def test_bfloat16_cache_outputs_stay_within_bfloat16_precision(head_dim, rep, sliding_window, softcap):
    """Odd and even lengths (an odd tile pairs its last position with zeros), several query heads per KV head, a
    window and soft-capping: the bfloat16 path's output stays within bfloat16's precision of the float32 one."""
    block_size, num_heads = 16, rep * NUM_KV_HEADS
    lengths = [1, 2, 3, 15, 16, 17, 33, 63, 64, 65, 127, 257, 600, 1301]
    tables, start = [], 0
    for n in lengths:
        count = -(-n // block_size)
        tables.append(list(range(start, start + count))[::-1])  # blocks out of order
        start += count
    caches = _caches(start * block_size, head_dim, torch.bfloat16, head_dim + rep)
    query = torch.randn(len(lengths), num_heads, head_dim).bfloat16()
    expected = _attend(query.float(), caches, tables, lengths, block_size, 2, sliding_window, softcap)
    out = _attend(query, caches, tables, lengths, block_size, 2, sliding_window, softcap)
    torch.testing.assert_close(out.float(), expected, atol=4e-3, rtol=1e-2)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("requests", REQUEST_MIXES)
def test_bfloat16_rows_get_the_same_numbers_in_any_batch_or_split(requests, head_dim):
    """Over a bfloat16 cache, a request's rows verifying drafts read together equal the same rows as separate
    requests over copies of their blocks, on one thread or two, bit for bit; and a long context alone (cut into more
    work items) equals itself in the batch. (Separate requests on the same blocks are a shared prefix, which
    test_decode_cascade.py covers.)"""
    block_size, num_heads = 16, 3 * NUM_KV_HEADS
    lengths, shared, _ = _mix_tables(requests, 400, block_size, random.Random(head_dim))
    caches = _caches(400 * block_size, head_dim, torch.bfloat16, 1)
    separate, copies = [], [[], []]
    for table in shared:
        separate.append([400 + len(copies[0]) + i for i in range(len(table))])
        for copy, cache in zip(copies, caches, strict=True):
            copy.extend(cache.view(400, block_size, *cache.shape[1:])[block] for block in table)
    caches = [torch.cat([cache, torch.stack(copy).flatten(0, 1)]) for cache, copy in zip(caches, copies, strict=True)]
    query = torch.randn(len(lengths), num_heads, head_dim).bfloat16()
    outs = [_attend(query, caches, tables, lengths, block_size, threads)
            for tables, threads in ((shared, 1), (shared, 2), (separate, 1), (separate, 2))]
    for other in outs[1:]:
        assert torch.equal(outs[0], other)
    longest = max(range(len(lengths)), key=lambda b: lengths[b])
    alone = _attend(query[longest:longest + 1], caches, [separate[longest]], [lengths[longest]], block_size, 2)
    assert torch.equal(alone[0], outs[0][longest])
