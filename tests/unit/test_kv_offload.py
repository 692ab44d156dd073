"""The host tier under the radix tree (no model, no torch): block keys, the host pool's LRU and pins, and a
scheduler fuzz whose stand-in worker keeps every block's tokens, so that any position read from a wrong block
fails."""

from __future__ import annotations

import random

import pytest

from radixlm.config import SchedulerConfig
from radixlm.core.block_keys import block_keys
from radixlm.core.disk_tier import DiskTier, list_block_files
from radixlm.core.host_tier import HostTier
from radixlm.core.kv_cache_manager import KVCacheManager
from radixlm.core.scheduler import Scheduler
from radixlm.core.step import SchedulerOutput
from radixlm.request import Request
from radixlm.sampling_params import SamplingParams
from unit.fake_engine import runner_output


def test_block_keys_name_whole_prefixes():
    tokens = list(range(100, 130))
    keys = block_keys(tokens, 8)
    assert len(keys) == 3  # the partial fourth block has no key
    assert block_keys(tokens[:16], 8) == keys[:2]  # a prefix's keys are the sequence's first keys
    other = block_keys([*tokens[:8], 1, *tokens[9:]], 8)
    assert other[0] == keys[0] and other[1] != keys[1] and other[2] != keys[2]  # a change reaches every later key
    assert block_keys(tokens, 8, namespace=3)[0] != keys[0]
    assert block_keys(tokens, 8, salt=b"model")[0] != keys[0]


def test_host_tier_drops_least_recently_used_and_never_a_pinned_block():
    host = HostTier(2)
    a, b = host.store(b"a", 0), host.store(b"b", 0)
    assert host.store(b"c", 0) is None  # both pinned by this step
    host.step_handed_over()
    assert host.store(b"a", 0) is None and b"a" in host  # already held: now the most recent
    c = host.store(b"c", 0)
    assert c == b and b"b" not in host and host.stats.num_dropped_blocks == 1
    assert host.pin(b"a") == a and host.pin(b"b") is None
    host.check_invariants()


def test_host_tier_forgets_a_namespace_and_frees_pinned_blocks_only_after_the_step():
    host = HostTier(3)
    host.store(b"x", 1)
    host.store(b"y", 2)
    assert host.drop_namespace(1) == 1 and b"x" not in host
    host.check_invariants()
    host.store(b"z", 2)
    assert host.store(b"w", 2) is None  # x's block is still pinned: this step may still move it
    host.step_handed_over()
    assert host.store(b"w", 2) is not None
    host.clear()
    assert len(host) == 1  # w is pinned until the step is handed over
    host.check_invariants()


class BlockContents:
    """A stand-in worker that keeps each device and host block's tokens (and each block file's) and checks every
    context it reads. `lose_files`: the chance that a block file is gone (or bad) when it is read."""

    def __init__(self, block_size: int, lose_files: float = 0.0, seed: int = 0) -> None:
        self.block_size = block_size
        self.device: dict[int, list[int | None]] = {}
        self.host: dict[int, list[int | None]] = {}
        self.files: dict[bytes, list[int | None]] = {}
        self.num_loads = 0
        self.lose_files = lose_files
        self.rng = random.Random(seed)

    def run(self, scheduler: Scheduler, output: SchedulerOutput) -> list[bytes]:
        """Apply the step; returns the block files it could not read."""
        size = self.block_size
        failed = []
        transfers = output.kv_transfers
        if transfers is not None:
            for key in transfers.disk_deletes:
                self.files.pop(key, None)
            for host_block, key in transfers.disk_writes:
                self.files[key] = list(self.host[host_block])
            for device_block, key in transfers.device_saves:
                self.files[key] = list(self.device[device_block])
            for device_block, host_block in transfers.offloads:
                self.host[host_block] = list(self.device[device_block])
            for key, host_block in transfers.disk_reads:
                if key not in self.files or self.rng.random() < self.lose_files:
                    failed.append(key)
                    self.host[host_block] = [-1] * size  # what a bad file would leave
                else:
                    self.host[host_block] = list(self.files[key])
            for host_block, device_block in transfers.loads:
                self.device[device_block] = list(self.host[host_block])
                self.num_loads += 1
        for src, dst, num_tokens in output.block_copies:
            self.device[dst] = self.device[src][:num_tokens] + [None] * (size - num_tokens)
        for chunk in output.chunks:
            request = scheduler.requests[chunk.request_id]
            table, tokens = request.block_table, request.all_token_ids
            for position in range(chunk.start_position):
                block = self.device.get(table[position // size])
                assert block is not None and block[position % size] == tokens[position], (
                    f"{chunk.request_id} reads a wrong token at {position}")
            for position, token in zip(range(chunk.start_position, chunk.context_len), chunk.token_ids,
                                       strict=True):
                block = self.device.setdefault(table[position // size], [None] * size)
                block[position % size] = token
        for fork in output.forks:  # after the forward, as the worker does
            for src, dst, num_tokens in fork.block_copies:
                self.device[dst] = self.device[src][:num_tokens] + [None] * (size - num_tokens)
        return failed


def _drive(scheduler: Scheduler, worker: BlockContents) -> None:
    output = scheduler.schedule()
    failed = worker.run(scheduler, output)
    scheduler.update_from_output(output, runner_output(output, failed_keys=failed))
    scheduler.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_offloaded_prefixes_come_back_with_the_right_tokens(seed):
    """Shared prefixes over a device pool too small to keep them: the tree evicts them into the host tier, later
    prompts load them back, and every context a chunk reads holds exactly its request's tokens."""
    rng = random.Random(seed)
    block_size = 4
    manager = KVCacheManager(24, block_size, enable_prefix_caching=True, num_host_blocks=40)
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=3), manager, max_model_len=80)
    worker = BlockContents(block_size)
    prefixes = [[rng.randrange(3, 500) for _ in range(rng.randrange(9, 40))] for _ in range(5)]
    for index in range(60):
        prompt = rng.choice(prefixes) + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 6))]
        scheduler.add_request(Request(f"r{index}", prompt, SamplingParams(max_tokens=rng.randrange(1, 4),
                                                                         ignore_eos=True), arrival_order=index))
        for _ in range(rng.randrange(0, 3)):
            if scheduler.requests:
                output = scheduler.schedule()
                worker.run(scheduler, output)
                scheduler.update_from_output(output, runner_output(output))
                scheduler.check_invariants()
    while scheduler.requests:
        output = scheduler.schedule()
        worker.run(scheduler, output)
        scheduler.update_from_output(output, runner_output(output))
        scheduler.check_invariants()
    stats = manager.offload.stats  # type: ignore[union-attr]
    assert stats.num_offloaded_blocks > 0 and stats.num_loaded_blocks > 0 and worker.num_loads > 0
    assert stats.num_hit_tokens > 0


def test_a_reset_drops_instead_of_offloading_and_empties_the_host():
    manager = KVCacheManager(16, 4, enable_prefix_caching=True, num_host_blocks=8)
    scheduler = Scheduler(SchedulerConfig(), manager, max_model_len=60)
    scheduler.add_request(Request("a", list(range(10, 30)), SamplingParams(max_tokens=1), arrival_order=0))
    while scheduler.requests:
        output = scheduler.schedule()
        scheduler.update_from_output(output, runner_output(output))
    manager.reset_prefix_cache()
    assert manager.take_transfers() is None and len(manager.offload.host) == 0  # type: ignore[union-attr]


def _workload(scheduler: Scheduler, worker: BlockContents, rng: random.Random, num_requests: int,
              prefixes: list[list[int]], first_index: int = 0, n: int = 1) -> None:
    for index in range(first_index, first_index + num_requests):
        prompt = rng.choice(prefixes) + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 6))]
        params = SamplingParams(max_tokens=rng.randrange(1, 4), ignore_eos=True, n=rng.randrange(1, n + 1))
        first = Request(f"r{index}", prompt, params, arrival_order=index)
        siblings = [Request(f"r{index}#{k}", prompt, params, arrival_order=index) for k in range(1, params.n)]
        scheduler.add_request(first, siblings)
        for _ in range(rng.randrange(0, 3)):
            if scheduler.requests:
                _drive(scheduler, worker)
    while scheduler.requests:
        _drive(scheduler, worker)


def _disk_manager(num_host_blocks: int, disk: DiskTier) -> tuple[KVCacheManager, Scheduler]:
    manager = KVCacheManager(24, 4, enable_prefix_caching=True, num_host_blocks=num_host_blocks, disk=disk,
                             salt=b"model")
    return manager, Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=3), manager, max_model_len=80)


@pytest.mark.parametrize(("seed", "lose_files"), [(0, 0.0), (1, 0.0), (2, 0.3), (3, 0.3)])
def test_blocks_dropped_to_disk_come_back_with_the_right_tokens_or_are_recomputed(seed, lose_files):
    """A host tier too small for the prefixes drops blocks to disk; prompts that reach them wait a step for the
    files, then load them; a file that is gone or bad is forgotten and its tokens recomputed. Every context a
    chunk reads holds its request's tokens."""
    rng = random.Random(seed)
    manager, scheduler = _disk_manager(6, DiskTier(200))
    worker = BlockContents(4, lose_files, seed)
    prefixes = [[rng.randrange(3, 500) for _ in range(rng.randrange(9, 40))] for _ in range(5)]
    _workload(scheduler, worker, rng, 60, prefixes)
    stats = manager.offload.stats  # type: ignore[union-attr]
    assert stats.num_disk_written_blocks > 0 and stats.num_disk_read_blocks > 0
    assert (stats.num_disk_failed_blocks > 0) == (lose_files > 0)
    assert set(worker.files) >= set(manager.offload.disk.keys())  # type: ignore[union-attr]


def test_saved_prefixes_serve_a_restarted_scheduler():
    """`persist` writes the tree's and the host tier's blocks; a new scheduler over the same files (keys salted by
    the same model) finds them, and one salted by another model does not."""
    rng = random.Random(9)
    manager, scheduler = _disk_manager(8, DiskTier(100))
    worker = BlockContents(4)
    prefixes = [[rng.randrange(3, 500) for _ in range(32)] for _ in range(3)]
    _workload(scheduler, worker, rng, 6, prefixes)
    transfers = manager.persist_transfers()
    assert transfers is not None and transfers.device_saves
    worker.run(scheduler, SchedulerOutput(kv_transfers=transfers))
    for salt, expect_hits in ((b"model", True), (b"other model", False)):
        restarted = KVCacheManager(24, 4, enable_prefix_caching=True, num_host_blocks=8,
                                   disk=DiskTier(100, list(worker.files)), salt=salt)
        scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=3), restarted, max_model_len=80)
        fresh = BlockContents(4)
        fresh.files = dict(worker.files)
        _workload(scheduler, fresh, rng, 3, prefixes, first_index=100)
        assert (restarted.offload.stats.num_disk_read_blocks > 0) == expect_hits  # type: ignore[union-attr]


def test_disk_tier_keeps_its_budget_least_recently_used_first(tmp_path):
    disk = DiskTier(2, [b"a", b"b", b"c"])
    assert disk.take_deletions() == [b"a"] and disk.keys() == [b"b", b"c"]
    disk.touch(b"b")
    assert disk.add(b"d") == [b"c"] and disk.keys() == [b"b", b"d"]
    disk.discard(b"b")
    assert b"b" not in disk and len(disk) == 1
    for name in ("00ff.kv", "zz.kv", "0a0b.kv.123.tmp", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert list_block_files(tmp_path) == [bytes.fromhex("00ff")]
    assert list_block_files(tmp_path / "missing") == []


@pytest.mark.parametrize("seed", range(4))
def test_blocks_a_fork_takes_are_offloaded_before_the_fork_copy_overwrites_them(seed):
    """n > 1 requests fork after their prompt: the child's fresh block may come from evicting a tree leaf, whose
    offload must run in the same step, before the fork's copy overwrites the block."""
    rng = random.Random(seed)
    manager, scheduler = _disk_manager(40, DiskTier(200))
    worker = BlockContents(4)
    prefixes = [[rng.randrange(3, 500) for _ in range(rng.randrange(9, 40))] for _ in range(5)]
    _workload(scheduler, worker, rng, 40, prefixes, n=3)
    assert manager.offload.stats.num_loaded_blocks > 0  # type: ignore[union-attr]


def test_a_prompt_longer_than_the_host_tier_still_runs_after_a_restart():
    """Its disk blocks cannot all be in the host tier at once: it reads what fits, then runs (loading those and
    recomputing the rest), instead of reading the same files every step."""
    rng = random.Random(4)
    manager, scheduler = _disk_manager(12, DiskTier(100))
    worker = BlockContents(4)
    prefix = [rng.randrange(3, 500) for _ in range(60)]
    _workload(scheduler, worker, rng, 1, [prefix])
    transfers = manager.persist_transfers()
    assert transfers is not None
    worker.run(scheduler, SchedulerOutput(kv_transfers=transfers))
    restarted, scheduler = _disk_manager(4, DiskTier(100, list(worker.files)))
    fresh = BlockContents(4)
    fresh.files = dict(worker.files)
    scheduler.add_request(Request("again", [*prefix, 7], SamplingParams(max_tokens=1), arrival_order=0))
    for _ in range(10):
        if not scheduler.requests:
            break
        _drive(scheduler, fresh)
    assert not scheduler.requests, "the request never ran"
    assert restarted.offload.stats.num_hit_tokens > 0  # type: ignore[union-attr]


@pytest.mark.parametrize("budget", [1, 3])
def test_a_tiny_disk_budget_leaves_no_file_the_tier_does_not_know(budget):
    rng = random.Random(budget)
    manager, scheduler = _disk_manager(6, DiskTier(budget))
    worker = BlockContents(4)
    prefixes = [[rng.randrange(3, 500) for _ in range(rng.randrange(9, 40))] for _ in range(5)]
    _workload(scheduler, worker, rng, 30, prefixes)
    transfers = manager.persist_transfers()
    if transfers is not None:
        worker.run(scheduler, SchedulerOutput(kv_transfers=transfers))
    assert set(worker.files) == set(manager.offload.disk.keys())  # type: ignore[union-attr]
