import pytest

from radixlm.core.block_pool import BlockPool


def test_allocate_free_round_trip():
    pool = BlockPool(4)
    assert pool.can_allocate(4) and not pool.can_allocate(5)
    blocks = pool.allocate(3)
    assert len(set(blocks)) == 3 and pool.num_free_blocks == 1
    assert all(pool.ref_count(b) == 1 for b in blocks)
    pool.free(blocks)
    assert pool.num_free_blocks == 4 and pool.usage == 0.0
    pool.check_invariants()


def test_shared_block_returns_only_when_last_holder_frees():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.incref([block])
    pool.free([block])
    assert pool.ref_count(block) == 1 and pool.num_free_blocks == 1
    pool.free([block])
    assert pool.ref_count(block) == 0 and pool.num_free_blocks == 2
    pool.check_invariants()


def test_errors():
    pool = BlockPool(2)
    with pytest.raises(MemoryError):
        pool.allocate(3)
    with pytest.raises(ValueError, match="double free"):
        pool.free([0])
    with pytest.raises(ValueError, match="incref of free block"):
        pool.incref([1])
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)


def test_free_list_is_fifo_so_recently_freed_blocks_are_reused_last():
    pool = BlockPool(3)
    a, b, _c = pool.allocate(3)
    pool.free([b])
    pool.free([a])
    assert pool.allocate(2) == [b, a]


def test_check_invariants_catches_corruption():
    pool = BlockPool(2)
    pool.allocate(1)
    pool._ref_counts[0] = 0  # corrupt on purpose
    with pytest.raises(AssertionError):
        pool.check_invariants()
