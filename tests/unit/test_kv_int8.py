"""The int8 KV cache (`--kv-cache-dtype int8`): the torch reference format (radixlm.model.kv_int8), the C++ write
and kernel against it, and its capacity."""

import random

import pytest
import torch

from radixlm.model.attention.cpp_backend import DecodeTables, paged_decode_attention
from radixlm.model.attention.kv_write import write_kv
from radixlm.model.kv_cache import PagedKVCache, kv_bytes_per_token, num_blocks_for_budget
from radixlm.model.kv_int8 import dequantize_rows, quantize_rows
from radixlm.model.ops import extension_error
from unit.test_decode_kernel import LENGTHS, NUM_KV_HEADS, _run, _tables

needs_extension = pytest.mark.skipif(extension_error() is not None, reason="radixlm._C is not built")


def _hard_rows(num_rows: int, head_dim: int) -> torch.Tensor:
    """Rows over six orders of magnitude, plus a row of zeros, one of tiny values and one of exact ties."""
    torch.manual_seed(0)
    rows = torch.randn(num_rows, NUM_KV_HEADS, head_dim) * torch.logspace(-3, 3, num_rows)[:, None, None]
    rows[0] = 0.0
    rows[1] = 1e-30
    rows[2] = torch.arange(head_dim) % 5 - 2.5  # absmax 2.5: x / s lands on halves
    rows[2, :, 0] = 127 * 2.5 / 127
    return rows


def test_dequantized_rows_are_within_half_a_step():
    rows = _hard_rows(40, 64)
    quantized, scales = quantize_rows(rows)
    assert quantized.dtype == torch.int8 and scales.dtype == torch.float16 and scales.shape == rows.shape[:2]
    error = (dequantize_rows(quantized, scales, torch.float32) - rows).abs()
    step = scales.float()[..., None]
    assert (error <= step * 0.5001 + 1e-30).all()
    assert torch.equal(quantized[0], torch.zeros_like(quantized[0])) and (scales[0] == 0).all()
    assert quantized.abs().max() == 127


@needs_extension
@pytest.mark.parametrize("head_dim", [64, 128, 80])
def test_the_cpp_write_quantizes_exactly_as_the_reference(head_dim):
    """Bit for bit: the int8 values and float16 scales of write_kv's C++ path equal quantize_rows', from transposed
    (strided) rows, at scattered slots."""
    rows = _hard_rows(24, head_dim)
    keys, values = rows, (rows * -0.5).transpose(0, 1).contiguous().transpose(0, 1)
    cache = PagedKVCache(1, 4, 16, NUM_KV_HEADS, head_dim, torch.int8)
    slots = torch.tensor(random.Random(head_dim).sample(range(64), len(rows)))
    write_kv(cache.layer(0), slots, keys, values)
    layer = cache.layer(0)
    for cache_rows, scales, written in ((layer.keys, layer.key_scales, keys), (layer.values, layer.value_scales,
                                                                                 values)):
        expected_rows, expected_scales = quantize_rows(written)
        assert torch.equal(cache_rows[slots], expected_rows)
        assert torch.equal(scales[slots], expected_scales)


@needs_extension
@pytest.mark.parametrize("head_dim", [64, 128, 80])  # 80: the generic (not register-tiled) path
@pytest.mark.parametrize("rep", [1, 4])
@pytest.mark.parametrize(("sliding_window", "softcap"), [(None, None), (40, 30.0)])
def test_int8_kernel_matches_torch(head_dim, rep, sliding_window, softcap):
    """The kernel, dequantizing in registers, against the torch path over the same int8 cache: decodes and a prefill
    chunk (which reads its own K/V back quantized on both paths). The C++ backend attends the prefill chunk through
    SDPA in bfloat16 (cpp_backend's `PrefillSplit`), so its rows agree to bfloat16's rounding of the float32 query."""
    block_size = 16
    num_blocks = sum(-(-n // block_size) for n in LENGTHS) + 2
    tables = _tables("scattered", LENGTHS, block_size, num_blocks, random.Random(rep))
    reference, kernel = _run(LENGTHS, tables, rep * NUM_KV_HEADS, head_dim, block_size, torch.int8, sliding_window,
                             softcap, prefill_first=True)
    prefill = slice(0, 3)  # _run puts a 3-token prefill chunk first
    torch.testing.assert_close(kernel[:, prefill], reference[:, prefill], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(kernel[:, 3:], reference[:, 3:], atol=3e-5, rtol=1e-4)


@needs_extension
def test_int8_cache_stays_close_to_float32():
    """Quantizing K/V moves the outputs by about its step: well within a few percent of the float32 cache's."""
    block_size = 16
    num_blocks = sum(-(-n // block_size) for n in LENGTHS) + 2
    tables = _tables("contiguous", LENGTHS, block_size, num_blocks, random.Random(5))
    _, full = _run(LENGTHS, tables, 6, 64, block_size, torch.float32, None, None, prefill_first=False)
    _, narrow = _run(LENGTHS, tables, 6, 64, block_size, torch.int8, None, None, prefill_first=False)
    torch.testing.assert_close(narrow, full, atol=3e-2, rtol=3e-2)


@needs_extension
@pytest.mark.parametrize("num_threads", [1, 2])
def test_the_kernel_writes_int8_rows_as_write_kv_does(num_threads):
    """Given the step's new K/V, the kernel quantizes them into the caches exactly as write_kv does (values and
    scales), and attends the same bits as write_kv followed by the kernel."""
    block_size, head_dim = 16, 64
    lengths = [1, 30, 200, 700]
    tables = [[8 * b + k for k in range(-(-n // block_size))] for b, n in enumerate([1, 30, 200, 0])]
    tables[3] = list(range(40, 40 + 44))
    slots = torch.tensor([t[(n - 1) // block_size] * block_size + (n - 1) % block_size
                          for t, n in zip(tables, lengths, strict=True)])
    torch.manual_seed(3)
    query = torch.randn(len(lengths), 3 * NUM_KV_HEADS, head_dim)
    keys, values = torch.randn(2, len(lengths), NUM_KV_HEADS, head_dim)
    decode_tables = DecodeTables.build(tables, lengths, block_size)
    caches = []
    for _ in range(2):
        cache = PagedKVCache(1, 90, block_size, NUM_KV_HEADS, head_dim, torch.int8)
        torch.manual_seed(4)
        write_kv(cache.layer(0), torch.arange(cache.num_slots), *torch.randn(2, cache.num_slots, NUM_KV_HEADS,
                                                                             head_dim))
        caches.append(cache)
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        write_kv(caches[0].layer(0), slots, keys, values)
        expected = paged_decode_attention(query, caches[0].layer(0), decode_tables, 0.125, None, None)
        out = paged_decode_attention(query, caches[1].layer(0), decode_tables, 0.125, None, None,
                                     (slots, keys, values))
    finally:
        torch.set_num_threads(previous)
    assert all(torch.equal(a, b) for a, b in zip(caches[0].layer(0), caches[1].layer(0), strict=True))
    assert torch.equal(out, expected)


@needs_extension
def test_int8_caches_need_their_scales():
    cache = torch.zeros(64, 2, 64, dtype=torch.int8)
    scales = torch.zeros(64, 2, dtype=torch.float16)
    rows = torch.zeros(1, 2, 64)
    with pytest.raises(RuntimeError, match="need key_scales"):
        torch.ops.radixlm.write_kv(cache, cache.clone(), torch.tensor([0]), rows, rows)
    with pytest.raises(RuntimeError, match="float16"):
        torch.ops.radixlm.write_kv(cache, cache.clone(), torch.tensor([0]), rows, rows, scales.float(), scales)
    with pytest.raises(RuntimeError, match="int8 caches only"):
        torch.ops.radixlm.write_kv(cache.float(), cache.float(), torch.tensor([0]), rows, rows, scales, scales)
    with pytest.raises(RuntimeError, match=r"\[num_slots, Hkv\]"):
        torch.ops.radixlm.write_kv(cache, cache.clone(), torch.tensor([0]), rows, rows, scales[:8], scales[:8])


def test_int8_holds_at_least_1_9x_the_tokens_of_bfloat16():
    for head_dim in (64, 128):
        bf16 = kv_bytes_per_token(30, 3, head_dim, torch.bfloat16)
        int8 = kv_bytes_per_token(30, 3, head_dim, torch.int8)
        assert int8 == 2 * 30 * 3 * (head_dim + 2)
        blocks = [num_blocks_for_budget("256MiB", per_token * 16) for per_token in (bf16, int8)]
        assert blocks[1] >= 1.9 * blocks[0]


def test_int8_cache_blocks_copy_with_their_scales():
    cache = PagedKVCache(2, 4, 4, NUM_KV_HEADS, 8, torch.int8)
    for layer in range(2):
        write_kv(cache.layer(layer), torch.arange(4), *torch.randn(2, 4, NUM_KV_HEADS, 8))
    cache.copy_blocks([(0, 3, 3)])
    for layer in range(2):
        for part in cache.layer(layer):
            assert torch.equal(part[12:15], part[0:3])


def test_the_rotation_is_orthonormal_and_spreads_an_outlier_channel():
    """The Hadamard rotation (radixlm.model.kv_int8.rotation) keeps dot products and is its own inverse; rows with
    one large channel, as keys have, come back from int8 with a fraction of the error when rotated first."""
    from radixlm.model.kv_int8 import rotation

    assert rotation(80) is None and rotation(1) is None
    matrix = rotation(64)
    assert matrix is not None
    torch.testing.assert_close(matrix @ matrix, torch.eye(64), atol=1e-6, rtol=0)
    torch.manual_seed(0)
    rows = torch.randn(256, NUM_KV_HEADS, 64)
    rows[..., 3] *= 40  # an outlier channel
    plain = dequantize_rows(*quantize_rows(rows), torch.float32)
    rotated = dequantize_rows(*quantize_rows(rows @ matrix), torch.float32) @ matrix
    assert (rotated - rows).norm() < 0.3 * (plain - rows).norm()
    cache = PagedKVCache(1, 2, 4, NUM_KV_HEADS, 64, torch.int8)
    assert cache.rotation is not None and PagedKVCache(1, 2, 4, NUM_KV_HEADS, 80, torch.int8).rotation is None
    assert PagedKVCache(1, 2, 4, NUM_KV_HEADS, 64, torch.bfloat16).rotation is None
