"""A bfloat16 model's queries and new K/V rows go into the decode kernel and `write_kv` as they are: the same caches
and outputs as their float32 values give, the output rounded to bfloat16 once."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.model.attention.cpp_backend import DecodeTables, paged_decode_attention
from radixlm.model.attention.kv_write import write_kv
from radixlm.model.ops import extension_error
from tests.unit.test_decode_kernel import NUM_KV_HEADS, WRITE_MIXES, _layer, _mix_tables

pytestmark = pytest.mark.skipif(extension_error() is not None,
                                reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("requests", WRITE_MIXES)
def test_bfloat16_queries_and_rows_get_what_their_float32_values_get(requests, kv_dtype):
    """A bfloat16 model's query and new K/V go in as they are (no conversion around the op): the caches and the
    output are those of the same values in float32, the output rounded to bfloat16 once."""
    block_size, head_dim, num_heads = 16, 64, 3 * NUM_KV_HEADS
    lengths, tables, _ = _mix_tables(requests, 800, block_size, random.Random(len(requests)))
    slot_mapping = torch.tensor([table[(n - 1) // block_size] * block_size + (n - 1) % block_size
                                 for n, table in zip(lengths, tables, strict=True)])
    torch.manual_seed(5)
    caches = [torch.randn(800 * block_size, NUM_KV_HEADS, head_dim).to(kv_dtype) for _ in range(2)]
    query = torch.randn(len(lengths), num_heads, head_dim).bfloat16()
    keys, values = (torch.randn(NUM_KV_HEADS, len(lengths), head_dim).bfloat16().transpose(0, 1) for _ in range(2))
    decode_tables = DecodeTables.build(tables, lengths, block_size)
    as_float = [c.clone() for c in caches]
    expected = paged_decode_attention(query.float(), _layer(as_float), decode_tables, head_dim ** -0.5, None, None,
                                      (slot_mapping, keys.float(), values.float()))
    out = paged_decode_attention(query, _layer(caches), decode_tables, head_dim ** -0.5, None, None,
                                 (slot_mapping, keys, values))
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected.bfloat16())
    assert torch.equal(caches[0], as_float[0]) and torch.equal(caches[1], as_float[1])
    written = [c.clone() for c in caches]
    write_kv(_layer(written), slot_mapping, keys, values)  # the C++ write_kv takes bfloat16 rows too
    assert torch.equal(written[0], caches[0]) and torch.equal(written[1], caches[1])
