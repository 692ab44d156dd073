"""The host tier under the radix tree on a real (tiny) model: prefixes evicted from a small device cache come back
from host memory and give exactly the tokens recomputing them gives; the copies move every tensor of the cache."""

import json

import pytest
import torch

from e2e.engine_runs import assert_all_blocks_released
from radixlm.core.host_tier import KVTransfers
from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.model.attention.kv_write import write_kv
from radixlm.model.host_kv_cache import HostKVCache
from radixlm.model.kv_cache import PagedKVCache
from radixlm.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _prompts() -> list[list[int]]:
    """Four 40-token prefixes, each asked three times with its own tail, in rounds: a round's prefixes do not all
    fit in 20 blocks of 4 tokens, so by the next round the tree has evicted them."""
    generator = torch.Generator().manual_seed(3)
    prefixes = [torch.randint(3, 300, (40,), generator=generator).tolist() for _ in range(4)]
    return [prefix + [5 + round_, 7 + index] for round_ in range(3) for index, prefix in enumerate(prefixes)]


def _outputs(model: str, **options) -> tuple[list[list[int]], LLMEngine]:
    """Each prompt alone, in order, each finding the tree (and host tier) as the one before left it."""
    engine = build_engine(model=model, num_kv_blocks=20, block_size=4, **options)
    outputs = []
    for index, prompt in enumerate(_prompts()):
        engine.add_request(f"r{index}", prompt, PARAMS)
        while engine.has_unfinished_requests():
            for output in engine.step():
                tokens = output.outputs[0].token_ids
            engine.check_invariants()
        outputs.append(tokens)
    assert_all_blocks_released(engine)
    return outputs, engine


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_prefixes_loaded_back_from_the_host_give_the_tokens_recomputing_gives(tiny_model_dir, kv_cache_dtype):
    model = str(tiny_model_dir("llama"))
    recomputed, _ = _outputs(model, kv_cache_dtype=kv_cache_dtype)
    loaded, engine = _outputs(model, kv_cache_dtype=kv_cache_dtype, kv_offload_memory="1MiB")
    stats = engine.scheduler.kv_cache_manager.offload.stats
    assert stats.num_offloaded_blocks > 0 and stats.num_loaded_blocks > 0 and stats.num_hit_tokens >= 4 * 40
    assert engine.num_kv_transfer_steps > 0
    assert loaded == recomputed


def test_host_copies_move_every_tensor_and_the_last_load_of_a_block_wins():
    torch.manual_seed(0)
    cache = PagedKVCache(2, 6, 4, 2, 8, torch.int8)
    for layer in range(2):
        write_kv(cache.layer(layer), torch.arange(cache.num_slots), *torch.randn(2, cache.num_slots, 2, 8))
    before = [t.clone() for t in cache.tensors()]
    host = HostKVCache(cache, 3)
    host.apply(cache, KVTransfers(offloads=[(1, 0), (4, 2)]))
    host.apply(cache, KVTransfers(loads=[(2, 0), (0, 3), (0, 0)]))  # block 0 loaded twice: host block 0's wins
    for old, new in zip(before, cache.tensors(), strict=True):
        blocks_old, blocks_new = old.view(6, 4, *old.shape[1:]), new.view(6, 4, *new.shape[1:])
        assert torch.equal(blocks_new[0], blocks_old[1]) and torch.equal(blocks_new[3], blocks_old[1])
        assert torch.equal(blocks_new[[1, 2, 4, 5]], blocks_old[[1, 2, 4, 5]])


def test_a_trace_shows_tier_moves_and_replays_them(tiny_model_dir, tmp_path):
    """With a host tier the trace records each step's offloaded and loaded blocks, and its replay (a scheduler
    with the same host tier) makes every recorded decision again."""
    from radixlm.trace.replay import Trace, replay

    path = tmp_path / "trace.jsonl"
    engine = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=20, block_size=4,
                          kv_offload_memory="1MiB", trace=str(path))
    for index, prompt in enumerate(_prompts()):
        engine.add_request(f"r{index}", prompt, PARAMS)
        while engine.has_unfinished_requests():
            engine.step()
    engine.tracer.close()
    steps = [event for event in map(json.loads, path.read_text().splitlines()) if event["event"] == "step"]
    assert sum(step.get("offloaded_blocks", 0) for step in steps) > 0
    assert sum(step.get("loaded_blocks", 0) for step in steps) > 0
    num_matched, divergence = replay(Trace.load(path))
    assert divergence is None and num_matched == len(steps)
