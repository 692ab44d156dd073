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


def test_allocate_after_continues_a_run_when_free():
    pool = BlockPool(10)
    first = pool.allocate(2)  # 0, 1
    other = pool.allocate(1)  # 2
    assert pool.allocate(1, after=first[-1]) == [3]  # block 2 is taken: fall back to the oldest free one
    pool.free(other)
    assert pool.allocate(2, after=first[-1]) == [2, 4]  # 2 continues the run, 3 is taken, then the oldest
    assert pool.allocate(2, after=6) == [7, 8]
    pool.check_invariants()


def test_reserve_after_moves_the_following_blocks_to_the_back():
    pool = BlockPool(8)
    prompt = pool.allocate(2)  # 0, 1
    pool.reserve_after(prompt[-1], 3)  # 2, 3, 4 go to the back
    assert pool.free_block_ids() == [5, 6, 7, 2, 3, 4]
    assert pool.allocate(1) == [5]  # others take unreserved blocks first
    assert pool.allocate(2, after=prompt[-1]) == [2, 3]  # the request grows contiguously
    pool.check_invariants()


def test_any_free_block_can_be_taken_in_the_middle_of_the_list():
    pool = BlockPool(5)
    blocks = pool.allocate(5)
    pool.free([blocks[3], blocks[1], blocks[4]])
    assert pool.allocate(1, after=blocks[0]) == [blocks[1]]
    assert pool.free_block_ids() == [blocks[3], blocks[4]]
    pool.check_invariants()
