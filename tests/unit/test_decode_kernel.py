"""The C++ paged decode kernel against the pure-torch attention path, on random caches and block tables."""

import random

import pytest
import torch

from radixlm.core.step import ScheduledChunk, SchedulerOutput
from radixlm.model.attention import create_backend, paged_attention, resolve_backend
from radixlm.model.attention.cpp_backend import (
    CppAttentionMetadata,
    DecodeTables,
    decode_layer,
    paged_decode_attention,
)
from radixlm.model.attention.kv_write import write_kv
from radixlm.model.input_batch import InputBatch
from radixlm.model.kv_cache import LayerCache, PagedKVCache
from radixlm.model.ops import direct_kernel, extension_error

pytestmark = pytest.mark.skipif(extension_error() is not None,
                                reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")

NUM_KV_HEADS = 2
LENGTHS = [1, 2, 15, 16, 17, 33, 100, 257, 600]


class _Layer(torch.nn.Module):
    layer_idx = 0


def _layer(caches: list[torch.Tensor]) -> LayerCache:
    """A float layer's caches, [keys, values]."""
    return LayerCache(caches[0], caches[1], None, None)


def fill_random(cache: PagedKVCache) -> None:
    """Every slot of layer 0 random (standard normal; an int8 cache holds them rotated and quantized, as its
    attention layers write them: see radixlm.model.kv_int8)."""
    layer = cache.layer(0)
    rows = [torch.randn(layer.keys.shape) for _ in range(2)]
    if cache.rotation is not None:
        rows = [row @ cache.rotation for row in rows]
    write_kv(layer, torch.arange(layer.keys.shape[0]), *rows)


def _tables(kind: str, lengths: list[int], block_size: int, num_blocks: int, rng: random.Random) -> list[list[int]]:
    """Block tables of one kind: "contiguous" runs, "scattered" (shuffled blocks), "shared" (every request starts
    with the same prefix blocks, then scattered private ones)."""
    needed = [-(-n // block_size) for n in lengths]
    free = list(range(num_blocks))
    if kind != "contiguous":
        rng.shuffle(free)
    shared = free[:3] if kind == "shared" else []
    free = free[len(shared):]
    tables = []
    for count in needed:
        own = count - len(shared) if kind == "shared" else count
        table = shared[:count] + free[:max(own, 0)]
        free = free[max(own, 0):]
        tables.append(table)
    return tables


def _run(lengths: list[int], tables: list[list[int]], num_heads: int, head_dim: int, block_size: int,
         kv_dtype: torch.dtype, sliding_window: int | None, softcap: float | None, prefill_first: bool,
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention outputs `[1, T, Hq, D]` of the torch path and the kernel path over the same step."""
    torch.manual_seed(0)
    num_blocks = 2 + max(max(t) for t in tables)  # the last one is the prefill's own
    cache = PagedKVCache(1, num_blocks, block_size, NUM_KV_HEADS, head_dim, kv_dtype)
    fill_random(cache)
    chunks = [ScheduledChunk(f"r{i}", [1], n - 1, table, num_sampled=1)
              for i, (n, table) in enumerate(zip(lengths, tables, strict=True))]
    if prefill_first:  # decodes whose query rows do not start at 0
        chunks.insert(0, ScheduledChunk("prefill", [1, 2, 3], 0, [num_blocks - 1], num_sampled=1))
    output = SchedulerOutput(chunks=chunks)
    num_rows = sum(c.num_tokens for c in chunks)
    query = torch.randn(1, num_heads, num_rows, head_dim)
    key, value = torch.randn(2, 1, NUM_KV_HEADS, num_rows, head_dim)
    results = []
    for kernel in (False, True):
        metadata = InputBatch.build(output.chunks, {c.request_id: c.new_block_ids for c in output.chunks}, cache,
                                    attention=create_backend("cpp" if kernel else "torch")).attn_metadata
        assert isinstance(metadata, CppAttentionMetadata) == kernel
        out, _ = paged_attention(_Layer(), query, key, value, None, scaling=head_dim ** -0.5,
                                 sliding_window=sliding_window, softcap=softcap, radix_attn=metadata)
        results.append(out)
    return results[0], results[1]


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128, 80])  # 80: the generic (not register-tiled) path
@pytest.mark.parametrize("rep", [1, 3, 4])
@pytest.mark.parametrize("kind", ["contiguous", "scattered", "shared"])
def test_kernel_matches_torch(kind, rep, head_dim, block_size):
    rng = random.Random(rep * 1000 + head_dim + block_size)
    lengths = LENGTHS if kind != "shared" else [n + 3 * block_size for n in LENGTHS]
    num_blocks = sum(-(-n // block_size) for n in lengths) + 2
    tables = _tables(kind, lengths, block_size, num_blocks, rng)
    reference, kernel = _run(lengths, tables, rep * NUM_KV_HEADS, head_dim, block_size, torch.float32, None, None,
                             prefill_first=kind == "scattered")
    torch.testing.assert_close(kernel, reference, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("sliding_window", "softcap"), [(None, 50.0), (8, None), (40, 30.0), (1, None)])
def test_window_softcap_and_bf16(sliding_window, softcap, kv_dtype):
    block_size = 16
    num_blocks = sum(-(-n // block_size) for n in LENGTHS) + 2
    tables = _tables("scattered", LENGTHS, block_size, num_blocks, random.Random(3))
    reference, kernel = _run(LENGTHS, tables, 6, 64, block_size, kv_dtype, sliding_window, softcap,
                             prefill_first=True)
    # The prefill's 3 rows: the torch path attends over their fresh float32 K/V; the C++ backend over a float32
    # cache on the kernel, over a bfloat16 one through SDPA in bfloat16 (queries and K/V rounded to bfloat16).
    prefill_tolerance = 3e-2 if kv_dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(kernel[:, :3], reference[:, :3], atol=prefill_tolerance, rtol=prefill_tolerance)
    torch.testing.assert_close(kernel[:, 3:], reference[:, 3:], atol=2e-5, rtol=1e-4)


def test_bf16_cache_stays_close_to_float32():
    """The narrower cache only rounds K/V: outputs stay within bfloat16's precision of the float32 cache's."""
    block_size = 16
    num_blocks = sum(-(-n // block_size) for n in LENGTHS) + 2
    tables = _tables("contiguous", LENGTHS, block_size, num_blocks, random.Random(5))
    _, full = _run(LENGTHS, tables, 6, 64, block_size, torch.float32, None, None, prefill_first=False)
    _, narrow = _run(LENGTHS, tables, 6, 64, block_size, torch.bfloat16, None, None, prefill_first=False)
    torch.testing.assert_close(narrow, full, atol=3e-2, rtol=3e-2)


def test_tables_hold_only_the_blocks_in_use():
    tables = DecodeTables.build([[4, 5, 6, 7], [9, 2]], [33, 16], block_size=16)
    assert tables.block_table.tolist() == [4, 5, 6, 9]
    assert tables.block_offsets.tolist() == [0, 3]
    assert tables.context_lens.dtype == torch.int32


def test_verification_rows_share_one_table():
    verifying = [4, 5, 6, 7]
    tables = DecodeTables.build([verifying, verifying, verifying, [9, 2], [9, 2]], [16, 17, 33, 16, 16],
                                block_size=16)
    assert tables.block_table.tolist() == [4, 5, 6, 9, 9]  # equal lists are shared only when they are one object
    assert tables.block_offsets.tolist() == [0, 0, 0, 3, 4]


# (start, number of rows) per request: a plain decode, verifications crossing tile and block edges, another decode;
# one long verification alone (its rows are cut into pieces for the threads); verifications whose rows end on
# both sides of a context split (512) and a decode spanning three splits; or a verification whose rows end on both
# sides of 768, where a context stops folding its remainder into the split before (two runs of rows, then); or
# enough requests verifying drafts that even two threads take whole rows (which stream in, staggered).
REQUEST_MIXES = [[(100, 1), (29, 17), (62, 5), (300, 9), (7, 1)], [(700, 17)], [(500, 17), (1500, 3), (5, 1)],
                 [(760, 17), (1030, 2)], [(40 + 37 * i, 3) for i in range(9)]]


def _mix_tables(requests: list[tuple[int, int]], num_blocks: int, block_size: int,
                rng: random.Random) -> tuple[list[int], list[list[int]], list[int]]:
    """Context lengths and block tables of a request mix, a row per (start, number of rows) position: the rows of
    one request share one table object (scattered blocks). Also returns the blocks left free."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    lengths, tables = [], []
    for start, num_rows in requests:
        table = [free.pop() for _ in range(-(-(start + num_rows) // block_size))]
        lengths.extend(start + j + 1 for j in range(num_rows))
        tables.extend([table] * num_rows)
    return lengths, tables, free


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.int8])
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("sliding_window", [None, 40])
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("requests", REQUEST_MIXES)
def test_rows_verifying_drafts_get_exactly_what_each_gets_alone(head_dim, sliding_window, num_threads, requests,
                                                                 kv_dtype):
    """A request's rows read together (one table, one pass over the context) equal the same rows as separate
    requests, bit for bit, whatever the work split; and both agree with the torch path (over an int8 cache too:
    its scales are applied per row)."""
    block_size, num_heads = 16, 3 * NUM_KV_HEADS
    rng = random.Random(head_dim)
    num_blocks = 200
    cache = PagedKVCache(1, num_blocks, block_size, NUM_KV_HEADS, head_dim, kv_dtype)
    torch.manual_seed(1)
    fill_random(cache)
    lengths, shared, _ = _mix_tables(requests, num_blocks, block_size, rng)
    separate = [list(table) for table in shared]  # equal lists, distinct objects: a table each
    query = torch.randn(len(lengths), num_heads, head_dim)
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        outs = [paged_decode_attention(query, cache.layer(0),
                                       DecodeTables.build(tables, lengths, block_size), head_dim ** -0.5,
                                       sliding_window, None) for tables in (shared, separate)]
    finally:
        torch.set_num_threads(previous)
    assert DecodeTables.build(shared, lengths, block_size).block_offsets.unique().numel() == len(requests)
    assert torch.equal(outs[0], outs[1])
    chunks = [ScheduledChunk(f"r{i}", [1] * num_rows, start, shared[sum(n for _, n in requests[:i])],
                             num_sampled=num_rows) for i, (start, num_rows) in enumerate(requests)]
    metadata = InputBatch.build(chunks, {c.request_id: c.new_block_ids for c in chunks}, cache).attn_metadata
    key, value = torch.randn(2, 1, NUM_KV_HEADS, len(lengths), head_dim)
    # The kernel is given rows as the attention interface gives them: rotated for an int8 cache (head_dim 64 has
    # a Hadamard rotation, 80 none), its output rotated back.
    rotation = cache.rotation if cache.rotation is not None else torch.eye(head_dim)
    write_kv(cache.layer(0), metadata.slot_mapping, key[0].transpose(0, 1) @ rotation,  # as the torch path does
             value[0].transpose(0, 1) @ rotation)
    kernel = paged_decode_attention(query @ rotation, cache.layer(0),
                                    DecodeTables.build(shared, lengths, block_size), head_dim ** -0.5,
                                    sliding_window, None) @ rotation
    reference, _ = paged_attention(_Layer(), query.transpose(0, 1)[None], key, value, None,
                                   scaling=head_dim ** -0.5, sliding_window=sliding_window, radix_attn=metadata)
    tolerance = 3e-5 if kv_dtype == torch.int8 else 1e-5
    torch.testing.assert_close(kernel, reference[0], atol=tolerance, rtol=tolerance)


# More mixes for the kernel's own K/V writes: many plain decodes (each item writes its own row), one long decode
# cut into splits and into single-head items, a verification whose first row ends a split (its rows are not one run
# of items, yet read each other's new positions), and a decode whose slot is not its last position (written before
# any item starts, like the rows of a verification).
WRITE_MIXES = [*REQUEST_MIXES, [(200 + 13 * i, 1) for i in range(20)], [(1300, 1)], [(766, 3), (40, 1)],
               [(90, 1), (50, 1)]]


@pytest.mark.parametrize("sliding_window", [None, 40])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("requests", WRITE_MIXES)
def test_the_kernel_writes_new_rows_as_write_kv_does(requests, num_threads, kv_dtype, sliding_window):
    """Given the step's new K/V, the kernel leaves the caches exactly as `write_kv` does and attends the same bits as
    `write_kv` followed by the kernel, whichever items write which rows (with a sliding window no rows are grouped,
    but a verification's rows still read each other's new positions)."""
    block_size, head_dim, num_heads = 16, 64, 3 * NUM_KV_HEADS
    rng = random.Random(len(requests))
    num_blocks = 800
    lengths, tables, free = _mix_tables(requests, num_blocks, block_size, rng)
    slots = [table[(n - 1) // block_size] * block_size + (n - 1) % block_size
             for n, table in zip(lengths, tables, strict=True)]
    if requests == WRITE_MIXES[-1]:
        slots[1] = free.pop() * block_size + 3  # not its last position: no item may own the write
    torch.manual_seed(4)
    caches = [torch.randn(num_blocks * block_size, NUM_KV_HEADS, head_dim).to(kv_dtype) for _ in range(2)]
    query = torch.randn(len(lengths), num_heads, head_dim)
    keys, values = (torch.randn(NUM_KV_HEADS, len(lengths), head_dim).transpose(0, 1) for _ in range(2))
    slot_mapping = torch.tensor(slots, dtype=torch.long)
    decode_tables = DecodeTables.build(tables, lengths, block_size)
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        separate = [c.clone() for c in caches]
        write_kv(_layer(separate), slot_mapping, keys, values)
        expected = paged_decode_attention(query, _layer(separate), decode_tables, head_dim ** -0.5, sliding_window,
                                          None)
        fused = [c.clone() for c in caches]
        out = paged_decode_attention(query, _layer(fused), decode_tables, head_dim ** -0.5, sliding_window, None,
                                     (slot_mapping, keys, values))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(fused[0], separate[0]) and torch.equal(fused[1], separate[1])
    assert torch.equal(out, expected)


@pytest.mark.parametrize("num_threads", [1, 2])
def test_a_long_context_gets_the_same_numbers_alone_or_in_a_batch(num_threads):
    """A lone request's long context is split into several work items (its KV heads alone are too few for the
    threads); in a full batch it is not cut further. The splits are fixed positions, so both give the same bits."""
    block_size, head_dim, num_heads = 16, 64, 3 * NUM_KV_HEADS
    lengths = [1300] + [37 + 11 * i for i in range(19)]
    tables = _tables("scattered", lengths, block_size, sum(-(-n // block_size) for n in lengths), random.Random(3))
    cache = PagedKVCache(1, 1 + max(max(t) for t in tables), block_size, NUM_KV_HEADS, head_dim, torch.float32)
    torch.manual_seed(2)
    cache.key_caches[0].copy_(torch.randn(cache.key_caches[0].shape))
    cache.value_caches[0].copy_(torch.randn(cache.value_caches[0].shape))
    query = torch.randn(len(lengths), num_heads, head_dim)
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        outs = [paged_decode_attention(query[:count], cache.layer(0),
                                       DecodeTables.build(tables[:count], lengths[:count], block_size),
                                       head_dim ** -0.5, None, None) for count in (1, len(lengths))]
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(outs[0][0], outs[1][0])


def test_backend_choice():
    assert resolve_backend("auto") == "cpp"
    assert resolve_backend("torch") == "torch"
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("fast")


def test_bad_tables_raise_instead_of_reading_out_of_bounds():
    op = torch.ops.radixlm.paged_decode_attention
    query, cache = torch.zeros(1, 2, 64), torch.zeros(64, 2, 64)  # 4 blocks of 16
    one = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="outside the cache"):
        op(query, cache, cache, torch.tensor([4], dtype=torch.int32), one, torch.tensor([3], dtype=torch.int32), 16,
           0.1, 0, 0.0)
    with pytest.raises(RuntimeError, match="needs 2 blocks"):
        op(query, cache, cache, torch.tensor([0], dtype=torch.int32), one, torch.tensor([17], dtype=torch.int32), 16,
           0.1, 0, 0.0)
    with pytest.raises(RuntimeError, match="must be positive"):  # an empty head_dim would size chunks by 0
        op(torch.zeros(1, 2, 0), torch.zeros(64, 2, 0), torch.zeros(64, 2, 0), torch.tensor([0], dtype=torch.int32),
           one, torch.tensor([3], dtype=torch.int32), 16, 0.1, 0, 0.0)


def test_rows_that_share_blocks_out_of_order_are_written_before_they_are_read():
    """Two rows over one table with falling lengths are two runs of items, and the first row's new slot is in a
    block the second reads: the kernel must write it before either item starts, even on one thread."""
    block_size, head_dim = 16, 64
    table = [3, 1, 4, 0, 5, 2, 6]
    lengths = [101, 100]
    slots = torch.tensor([table[(n - 1) // block_size] * block_size + (n - 1) % block_size for n in lengths])
    torch.manual_seed(5)
    caches = [torch.randn(8 * block_size, NUM_KV_HEADS, head_dim) for _ in range(2)]
    query = torch.randn(2, 3 * NUM_KV_HEADS, head_dim)
    keys, values = torch.randn(2, 2, NUM_KV_HEADS, head_dim)
    tables = DecodeTables.build([table, list(table)], lengths, block_size)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        separate = [c.clone() for c in caches]
        write_kv(_layer(separate), slots, keys, values)
        expected = paged_decode_attention(query, _layer(separate), tables, 0.125, None, None)
        out = paged_decode_attention(query, _layer(caches), tables, 0.125, None, None, (slots, keys, values))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(out, expected)


def test_a_nan_query_gives_a_nan_row_and_spares_the_others():
    block_size, head_dim = 16, 64
    caches = [torch.randn(8 * block_size, NUM_KV_HEADS, head_dim) for _ in range(2)]
    query = torch.randn(3, 3 * NUM_KV_HEADS, head_dim)
    query[1, 0, 5] = float("nan")
    tables = DecodeTables.build([[0, 1], [2, 3], [4, 5]], [20, 32, 7], block_size)
    out = paged_decode_attention(query, _layer(caches), tables, 0.125, None, None)
    assert out[1, 0].isnan().all()  # as SDPA: a NaN query's head comes out NaN
    assert not out[1, 1:].isnan().any() and not out[0].isnan().any() and not out[2].isnan().any()


def test_bad_new_rows_raise():
    op = torch.ops.radixlm.paged_decode_attention
    query, cache = torch.zeros(1, 2, 64), torch.zeros(64, 2, 64)
    table, one = torch.tensor([0], dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    rows = torch.zeros(1, 2, 64)
    args = (query, cache, cache.clone(), table, table, one, 16, 0.1, 0, 0.0)
    with pytest.raises(RuntimeError, match="go together"):
        op(*args, torch.tensor([0]), rows, None)
    with pytest.raises(RuntimeError, match="outside the cache"):
        op(*args, torch.tensor([64]), rows, rows)
    with pytest.raises(RuntimeError, match="one new K/V row per query row"):
        op(*args, torch.tensor([0, 1]), torch.zeros(2, 2, 64), torch.zeros(2, 2, 64))
    with pytest.raises(RuntimeError, match="keys/values must be"):
        op(*args, torch.tensor([0]), torch.zeros(1, 2, 32), rows)


@pytest.mark.parametrize(("sliding_window", "softcap"), [(None, None), (24, 30.0)])
def test_the_direct_decode_layer_gets_what_the_op_gets(sliding_window, softcap):
    """decode_layer (one C++ call from transformers' [1, H, T, D] tensors) writes the same caches and returns the
    same numbers as writing with write_kv and attending with the op."""
    block_size, head_dim, rep = 16, 64, 3
    lengths = [1, 17, 40, 100]
    tables = [[8 * b + k for k in range(8)][:-(-n // block_size)] for b, n in enumerate(lengths)]
    slots = torch.tensor([t[(n - 1) // block_size] * block_size + (n - 1) % block_size
                          for t, n in zip(tables, lengths, strict=True)])
    torch.manual_seed(7)
    caches = [torch.randn(32 * block_size, NUM_KV_HEADS, head_dim) for _ in range(2)]
    # As transformers hands them over: [1, H, T, D] views of [1, T, H, D] projections.
    query = torch.randn(1, len(lengths), rep * NUM_KV_HEADS, head_dim).transpose(1, 2)
    key, value = torch.randn(2, 1, len(lengths), NUM_KV_HEADS, head_dim).transpose(2, 3)
    decode_tables = DecodeTables.build(tables, lengths, block_size)
    separate = [c.clone() for c in caches]
    write_kv(_layer(separate), slots, key[0].transpose(0, 1), value[0].transpose(0, 1))
    expected = paged_decode_attention(query[0].transpose(0, 1), _layer(separate), decode_tables, 0.125, sliding_window,
                                      softcap)
    with torch.no_grad():
        out = decode_layer(query, key, value, _layer(caches), decode_tables, slots, 0.125, sliding_window, softcap)
    assert out is not None and out.shape == (1, len(lengths), rep * NUM_KV_HEADS, head_dim)
    assert torch.equal(out[0], expected)
    assert torch.equal(caches[0], separate[0]) and torch.equal(caches[1], separate[1])
    # Where the direct call does not apply, the caller takes the general path.
    assert decode_layer(query, key, value, _layer(caches), decode_tables, slots, 0.125, None, None) is None  # grad on
    with torch.no_grad():
        assert decode_layer(query.bfloat16(), key, value, _layer(caches), decode_tables, slots, 0.125, None,
                            None) is None  # the query's dtype differs from the rows'
        bf16 = decode_layer(query.bfloat16(), key.bfloat16(), value.bfloat16(), _layer(separate), decode_tables,
                            slots, 0.125, sliding_window, softcap)
    assert bf16 is not None and bf16.dtype == torch.bfloat16
    rounded = paged_decode_attention(query[0].transpose(0, 1).bfloat16().float(), _layer(separate), decode_tables,
                                     0.125, sliding_window, softcap)
    assert torch.equal(bf16[0], rounded.bfloat16())


def test_the_direct_entry_rejects_bad_arguments():
    direct = direct_kernel("decode_attention")
    query, rows = torch.zeros(1, 2, 1, 64), torch.zeros(1, 2, 1, 64)
    cache = torch.zeros(64, 2, 64)
    table, one = torch.tensor([0], dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    args = [query, rows, rows, cache, cache.clone(), table, table, one, torch.tensor([0]), 16, 0.1, 0, 0.0, None,
            None]
    assert direct(*args).shape == (1, 1, 2, 64)
    with pytest.raises(TypeError, match="takes 15 arguments"):
        direct(*args[:-1])
    with pytest.raises(TypeError, match="must be a tensor"):
        direct(*args[:8], None, *args[9:])
    with pytest.raises(TypeError):
        direct(*args[:9], 16.5, *args[10:])
    with pytest.raises(RuntimeError, match=r"\[1, H, T, D\]"):
        direct(query[0], *args[1:])
    with pytest.raises(RuntimeError, match="CPU tensors"):
        direct(query.to("meta"), *args[1:])
    with pytest.raises(RuntimeError, match="outside the cache"):
        direct(*args[:8], torch.tensor([10**9]), *args[9:])


def test_op_is_opaque_to_torch_compile():
    """The registered fake lets tracing see the output shape without running the kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        query = torch.empty(3, 6, 64)
        key_cache, value_cache = torch.empty(64, 2, 64), torch.empty(64, 2, 64)
        lens = torch.empty(3, dtype=torch.int32)
        out = torch.ops.radixlm.paged_decode_attention(query, key_cache, value_cache, lens, lens, lens, 16, 0.125, 0,
                                                       0.0)
    assert out.shape == (3, 6, 64)


@pytest.mark.parametrize("sliding_window", [None, 24])
def test_a_token_attends_alike_in_a_prefill_a_chunk_or_a_decode(sliding_window):
    """With the kernel every row attends like a decode, so a position's output is bit-identical whether its prompt
    was computed in one chunk, in several, or (after a prefix hit) as a one-token decode."""
    block_size, head_dim, num_heads, length = 16, 64, 3 * NUM_KV_HEADS, 70
    cache = PagedKVCache(1, 8, block_size, NUM_KV_HEADS, head_dim, torch.float32)
    table = [5, 2, 7, 0, 3]
    torch.manual_seed(2)
    query = torch.randn(1, num_heads, length, head_dim)
    key, value = torch.randn(2, 1, NUM_KV_HEADS, length, head_dim)
    outputs = {}
    for start in (0, 40, 69):  # the whole prompt, its last 30 tokens, its last token
        chunk = ScheduledChunk("r", [1] * (length - start), start, table, num_sampled=1)
        metadata = InputBatch.build([chunk], {"r": table}, cache, attention=create_backend("cpp")).attn_metadata
        out, _ = paged_attention(_Layer(), query[:, :, start:], key[:, :, start:], value[:, :, start:], None,
                                 scaling=head_dim ** -0.5, sliding_window=sliding_window, radix_attn=metadata)
        outputs[start] = out[0]
    assert torch.equal(outputs[40], outputs[0][40:])
    assert torch.equal(outputs[69], outputs[0][69:])


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_index_copy(kv_dtype):
    """The C++ K/V write puts exactly what index_copy_ puts (bfloat16 rounded alike), from transposed rows."""
    torch.manual_seed(0)
    slots = torch.tensor([5, 0, 63, 17, 40], dtype=torch.long)
    keys, values = (torch.randn(NUM_KV_HEADS, len(slots), 64).transpose(0, 1) * 1e3 for _ in range(2))
    caches = [(torch.randn(64, NUM_KV_HEADS, 64).to(kv_dtype), torch.randn(64, NUM_KV_HEADS, 64).to(kv_dtype))
              for _ in range(2)]
    expected_keys, expected_values = (c.clone() for c in caches[0])
    expected_keys.index_copy_(0, slots, keys.to(kv_dtype))
    expected_values.index_copy_(0, slots, values.to(kv_dtype))
    key_cache, value_cache = caches[1][0].copy_(caches[0][0]), caches[1][1].copy_(caches[0][1])
    write_kv(LayerCache(key_cache, value_cache, None, None), slots, keys, values)
    assert torch.equal(key_cache, expected_keys) and torch.equal(value_cache, expected_values)


def test_write_kv_rejects_slots_outside_the_cache():
    cache = torch.zeros(8, NUM_KV_HEADS, 64)
    rows = torch.zeros(1, NUM_KV_HEADS, 64)
    for slot in (8, -1):
        with pytest.raises(RuntimeError, match="outside the cache"):
            torch.ops.radixlm.write_kv(cache, cache.clone(), torch.tensor([slot]), rows, rows)
