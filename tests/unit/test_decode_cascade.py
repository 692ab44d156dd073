"""The decode kernel's shared-prefix part (csrc/attention/decode_cascade.cpp): over a bfloat16 cache, decoding rows
whose tables begin with the same blocks attend those positions together (on AMX tiles) and their own positions
apart. Each row's output stays within bfloat16's precision of the float32 path,
whatever the groups; rows the part does not take (a short common prefix, a verification's rows, a sliding window)
keep exactly the numbers they get alone."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.attention.kv_write import write_kv
from radixlm.model.attention.prefill_kernel import prefill_tiles_available
from radixlm.model.ops import extension_error
from tests.unit.test_decode_kernel import _layer
from tests.unit.test_decode_kernel_bf16 import _attend as attend_with_threads

pytestmark = pytest.mark.skipif(extension_error() is not None,
                                reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")

BLOCK_SIZE = 16
NUM_KV_HEADS = 2


class _Blocks:
    """Hands out fresh block ids."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> list[int]:
        self.next += count
        return list(range(self.next - count, self.next))[::-1]  # out of order


def _attend(query: torch.Tensor, caches: list[torch.Tensor], tables: list[list[int]], lengths: list[int],
            num_threads: int = 2, sliding_window: int | None = None, softcap: float | None = None,
            new_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    return attend_with_threads(query, caches, tables, lengths, BLOCK_SIZE, num_threads, sliding_window, softcap,
                               new_rows)


def _step(blocks: _Blocks) -> tuple[list[list[int]], list[int]]:
    """Two prefixes shared by interleaved rows (one of 62 blocks, rows with short and long own parts; one of 20), a
    row that shares only 10 blocks of the first (below the part's minimum), a verification's 3 rows on the first
    prefix, and a lone row."""
    first, second = blocks.take(62), blocks.take(20)
    tables, lengths = [], []
    for own in (3, 1, 90, 5, 2):  # 90 own blocks: the own part spans splits
        tables.append(first + blocks.take(own))
        lengths.append(62 * BLOCK_SIZE + own * BLOCK_SIZE - 7)
        tables.append(second + blocks.take(2))
        lengths.append(20 * BLOCK_SIZE + 2 * BLOCK_SIZE - own)
    tables.append(first[:10] + blocks.take(60))
    lengths.append(65 * BLOCK_SIZE)
    verification = first + blocks.take(2)
    for j in range(3):
        tables.append(verification)
        lengths.append(62 * BLOCK_SIZE + 20 + j)
    tables.append(blocks.take(30))
    lengths.append(29 * BLOCK_SIZE + 1)
    return tables, lengths


def _caches(num_blocks: int, head_dim: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(num_blocks * BLOCK_SIZE, NUM_KV_HEADS, head_dim, generator=generator).bfloat16()
            for _ in range(2)]


@pytest.mark.skipif(not prefill_tiles_available(), reason="the shared part needs AMX-BF16")
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize(("head_dim", "rep", "softcap"), [(64, 3, None), (128, 4, None), (64, 1, 30.0),
                                                          (128, 8, None)])
def test_rows_on_shared_prefixes_stay_within_bfloat16_precision(head_dim, rep, softcap, num_threads):
    """Every row against the float32 path (which has no shared part) over the same values, the step's new K/V rows
    written first as write_kv writes them; the rows the part does not take equal what each gets alone."""
    blocks = _Blocks()
    tables, lengths = _step(blocks)
    caches = _caches(blocks.next + 1, head_dim, head_dim + rep)
    generator = torch.Generator().manual_seed(rep)
    query = torch.randn(len(lengths), rep * NUM_KV_HEADS, head_dim, generator=generator).bfloat16()
    keys, values = (torch.randn(len(lengths), NUM_KV_HEADS, head_dim, generator=generator).bfloat16()
                    for _ in range(2))
    slots = torch.tensor([table[(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE
                          for n, table in zip(lengths, tables, strict=True)])
    written = [c.clone() for c in caches]
    write_kv(_layer(written), slots, keys, values)
    expected = _attend(query.float(), [c.float() for c in written], tables, lengths, softcap=softcap)
    out = _attend(query, caches, tables, lengths, num_threads, softcap=softcap, new_rows=(slots, keys, values))
    assert torch.equal(caches[0], written[0]) and torch.equal(caches[1], written[1])
    torch.testing.assert_close(out.float(), expected, atol=4e-3, rtol=1e-2)
    for b in (10, len(lengths) - 1):  # the row sharing 10 blocks, the lone row
        alone = _attend(query[b:b + 1], written, [tables[b]], [lengths[b]], softcap=softcap)
        assert torch.equal(alone[0], out[b])
    verification = list(range(11, 14))
    alone = _attend(query[verification], written, [tables[11]] * 3, [lengths[b] for b in verification],
                    softcap=softcap)
    assert torch.equal(alone, out[verification])


@pytest.mark.skipif(not prefill_tiles_available(), reason="the shared part needs AMX-BF16")
def test_a_group_gets_the_same_numbers_on_any_thread_count_and_row_order():
    """A row's numbers depend on its group's shared prefix, not on the threads or where the rows sit in the batch."""
    blocks = _Blocks()
    prefix = blocks.take(40)
    tables = [prefix + blocks.take(3) for _ in range(9)]
    lengths = [40 * BLOCK_SIZE + 20 + 3 * b for b in range(9)]
    caches = _caches(blocks.next, 64, 3)
    query = torch.randn(9, 3 * NUM_KV_HEADS, 64).bfloat16()
    out = _attend(query, caches, tables, lengths, 1)
    assert torch.equal(out, _attend(query, caches, tables, lengths, 2))
    order = [4, 0, 8, 2, 6, 1, 7, 3, 5]
    shuffled = _attend(query[order], caches, [tables[b] for b in order], [lengths[b] for b in order], 2)
    assert torch.equal(shuffled, out[order])


def test_rows_the_shared_part_does_not_take_get_what_each_gets_alone():
    """With a sliding window, with float32 queries over the bfloat16 cache, or with fewer rows on a prefix than the
    part's minimum (3), rows sharing a prefix get exactly what each gets alone."""
    blocks = _Blocks()
    prefix = blocks.take(40)
    tables = [prefix + blocks.take(2) for _ in range(4)]
    lengths = [40 * BLOCK_SIZE + 9 + b for b in range(4)]
    caches = _caches(blocks.next, 64, 4)
    query = torch.randn(4, 3 * NUM_KV_HEADS, 64).bfloat16()
    for q, window, rows in ((query, 300, 4), (query.float(), None, 4), (query, None, 2)):
        together = _attend(q[:rows], caches, tables[:rows], lengths[:rows], 2, window)
        for b in range(rows):
            assert torch.equal(_attend(q[b:b + 1], caches, [tables[b]], [lengths[b]], 2, window)[0], together[b])
