"""The paged prefill kernel (`torch.ops.radixlm.prefill_attention_paged`): every chunk of a step in one call, K/V
read through block tables, gives each row exactly what `prefill_attention` gives it over its gathered context,
whether chunks share cached prefix blocks (packed once) or not, at any block size, on the dot product or on AMX
tiles; bad tables are errors."""

import pytest
import torch

from radixlm.model.attention.prefill_kernel import prefill_tiles_available
from radixlm.model.ops import direct_kernel, extension_error

pytestmark = pytest.mark.skipif(
    extension_error() is not None or not direct_kernel("avx512_bf16_available")(),
    reason="needs radixlm._C on a CPU with AVX-512 BF16")

HQ, HKV, D, NUM_SLOTS = 6, 2, 64, 2048
TILES = [False, pytest.param(True, marks=pytest.mark.skipif(not prefill_tiles_available(),
                                                            reason="needs a CPU with AMX-BF16"))]


def make_cache(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(NUM_SLOTS, HKV, D, generator=generator).to(torch.bfloat16) for _ in "kv")


def slots_of(table: list[int], length: int, block_size: int) -> torch.Tensor:
    return torch.tensor([table[j // block_size] * block_size + j % block_size for j in range(length)])


def chunk_by_chunk(queries, keys, values, chunks, block_size, window, softcap, tiles=False):
    """Each chunk through the contiguous kernel over its gathered context: the reference."""
    out = torch.zeros_like(queries)
    for first_row, num_queries, context_len, table in chunks:
        slots = slots_of(table, context_len, block_size)
        rows = slice(first_row, first_row + num_queries)
        target = torch.empty_like(queries[rows])
        torch.ops.radixlm.prefill_attention(queries[rows], keys[slots], values[slots], target, 0.2, window, softcap,
                                            tiles)
        out[rows] = target
    return out


def paged(queries, keys, values, chunks, block_size, window, softcap, tiles=False):
    flat, segments = [], []
    for first_row, num_queries, context_len, table in chunks:
        segments.append([first_row, num_queries, context_len, len(flat)])
        flat.extend(table[:-(-context_len // block_size)])
    out = torch.zeros_like(queries)
    torch.ops.radixlm.prefill_attention_paged(queries, keys, values, out, torch.tensor(flat, dtype=torch.int32),
                                              torch.tensor(segments, dtype=torch.int64), block_size, 0.2, window,
                                              softcap, tiles)
    return out


def step_chunks(block_size: int) -> tuple[int, list[tuple[int, int, int, list[int]]]]:
    """The step's rows and chunks (first row, rows, context, blocks): rows 0-2 belong to no chunk; a fresh 70-token
    prompt; the last 10 positions of a 150-token prefix; three questions after that prefix's whole blocks (shared
    64-key blocks, and partial ones of their own); a chunk over 300 positions; blocks in scrambled order."""
    order = torch.randperm(NUM_SLOTS // block_size, generator=torch.Generator().manual_seed(block_size)).tolist()

    def blocks(num_positions: int) -> list[int]:
        taken = order[:-(-num_positions // block_size)]
        del order[:len(taken)]
        return taken

    prefix = blocks(150)
    chunks = [(3, 70, 70, blocks(70)), (73, 10, 150, prefix)]
    row, shared = 83, prefix[:150 // block_size]
    for question_len in (32, 5, 40):
        context_len = len(shared) * block_size + question_len
        chunks.append((row, question_len, context_len, shared + blocks(question_len)))
        row += question_len
    chunks.append((row, 9, 300, blocks(300)))
    return row + 9 + 2, chunks


@pytest.mark.parametrize("tiles", TILES, ids=["dot", "tiles"])
@pytest.mark.parametrize("block_size", [4, 16, 128])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (33, 0.0), (0, 20.0)])
def test_paged_equals_chunk_by_chunk(block_size: int, window: int, softcap: float, tiles: bool) -> None:
    keys, values = make_cache(block_size)
    num_rows, chunks = step_chunks(block_size)
    queries = torch.randn(num_rows, HQ, D, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    expected = chunk_by_chunk(queries, keys, values, chunks, block_size, window, softcap, tiles)
    got = paged(queries, keys, values, chunks, block_size, window, softcap, tiles)
    assert torch.equal(got, expected)
    assert got[:3].eq(0).all() and got[-2:].eq(0).all()  # rows of no chunk untouched


def test_heads_major_query_view() -> None:
    """Queries as transformers lays them out (`[Hq, T, D]` transposed), as the backend passes them."""
    keys, values = make_cache(0)
    chunks = [(0, 40, 100, list(range(7)))]
    queries = torch.randn(HQ, 40, D).to(torch.bfloat16)
    expected = chunk_by_chunk(queries.transpose(0, 1).contiguous(), keys, values, chunks, 16, 0, 0.0)
    assert torch.equal(paged(queries.transpose(0, 1), keys, values, chunks, 16, 0, 0.0), expected)


@pytest.mark.parametrize("bad", ["block outside cache", "negative block", "table too short", "rows past queries",
                                 "short context", "segments shape", "table dtype", "block size", "huge rows",
                                 "huge context", "huge offset", "huge block size", "nan scale"])
def test_bad_tables_are_errors(bad: str) -> None:
    keys, values = make_cache(0)
    queries = torch.zeros(8, HQ, D, dtype=torch.bfloat16)
    out = torch.empty_like(queries)
    table = torch.tensor([0, 1], dtype=torch.int32)
    segments = torch.tensor([[0, 8, 20, 0]])
    block_size, scale = 16, 0.2
    if bad == "block outside cache":
        table = torch.tensor([0, NUM_SLOTS // 16], dtype=torch.int32)
    elif bad == "negative block":
        table = torch.tensor([0, -1], dtype=torch.int32)
    elif bad == "table too short":
        segments = torch.tensor([[0, 8, 20, 1]])
    elif bad == "rows past queries":
        segments = torch.tensor([[4, 8, 20, 0]])
    elif bad == "short context":
        segments = torch.tensor([[0, 8, 7, 0]])
    elif bad == "segments shape":
        segments = torch.tensor([[0, 8, 20]])
    elif bad == "table dtype":
        table = table.long()
    elif bad == "huge rows":  # first row + rows would overflow int64
        segments = torch.tensor([[2**62, 2**62, 2**62, 0]])
    elif bad == "huge context":
        segments = torch.tensor([[0, 8, 2**63 - 1, 0]])
    elif bad == "huge offset":
        segments = torch.tensor([[0, 8, 20, 2**63 - 2]])
    elif bad == "huge block size":
        block_size = 2**62
    elif bad == "nan scale":
        scale = float("nan")
    else:
        block_size = 0
    with pytest.raises(RuntimeError):
        torch.ops.radixlm.prefill_attention_paged(queries, keys, values, out, table, segments, block_size, scale, 0,
                                                  0.0)
