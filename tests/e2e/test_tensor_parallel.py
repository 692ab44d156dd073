"""Greedy output with tensor_parallel_size=2 (two CPU processes, gloo) equals HF generate token for token, with
chunked prefill, preemption and prefix-cache hits in one engine's life; a rank that dies is named."""

import os
import signal
import time

import pytest
import torch
from tiny_models import build_tiny_model

from e2e.engine_runs import output_token_ids, run
from e2e.hf_reference import hf_greedy
from e2e.test_greedy_matches_hf import MAX_NEW, random_prompts
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams
from radixlm.worker.process import WorkerDiedError

# A small pool and step budget: prompts of up to 60 tokens are prefilled in chunks, and 8 requests outgrow 24
# blocks of 4 tokens, so some are preempted and resumed.
TIGHT = dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=16, num_threads=1)


def shared_prefix_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, 300, (37,), generator=generator).tolist()
    return [prefix + torch.randint(3, 300, (n,), generator=generator).tolist() for n in (5, 9, 1)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tensor_parallel_greedy_matches_hf_generate(arch, tiny_model_dir):
    model_dir = tiny_model_dir(arch)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    engine = build_engine(model=str(model_dir), tensor_parallel_size=2, **TIGHT)
    try:
        first = output_token_ids(engine, random_prompts(), params)
        assert engine.scheduler.num_preemptions > 0, "the run did not force preemption"
        hits_before = engine.scheduler.kv_cache_manager.stats.num_hit_tokens
        second = output_token_ids(engine, shared_prefix_prompts(), params)
        assert engine.scheduler.kv_cache_manager.stats.num_hit_tokens - hits_before >= 36, "no prefix hits"
    finally:
        engine.close()
    assert first == hf_greedy(model_dir, random_prompts(), MAX_NEW)
    assert second == hf_greedy(model_dir, shared_prefix_prompts(), MAX_NEW)


def sampled_outputs(model_dir, tensor_parallel_size: int) -> list[list[int]]:
    """n = 3 seeded sequences per prompt (forks: the followers copy the parent's partial block too), n-gram drafts
    verified in the batch, prompt logprobs; every sequence's tokens, prompt by prompt."""
    engine = build_engine(model=str(model_dir), tensor_parallel_size=tensor_parallel_size, num_kv_blocks=256,
                          block_size=4, num_threads=1, speculative_config='{"num_speculative_tokens": 3}')
    params = SamplingParams(n=3, seed=11, temperature=0.8, max_tokens=12, ignore_eos=True, prompt_logprobs=1)
    try:
        results = run(engine, [(f"req-{i}", p, params) for i, p in enumerate(random_prompts()[:4])])
    finally:
        engine.close()
    return [results[f"req-{i}"].token_ids(j) for i in range(4) for j in range(3)]


def test_tensor_parallel_sampling_forks_and_drafts_match_one_process(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    assert sampled_outputs(model_dir, 2) == sampled_outputs(model_dir, 1)


def test_replicated_kv_head_matches_hf_generate(tmp_path):
    """One KV head, two ranks: each rank computes and caches the whole KV head its query heads read."""
    model_dir = build_tiny_model("llama", tmp_path / "llama-kv1", num_key_value_heads=1)
    engine = build_engine(model=str(model_dir), tensor_parallel_size=2, **TIGHT)
    try:
        outputs = output_token_ids(engine, random_prompts(), SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                                                            ignore_eos=True))
    finally:
        engine.close()
    assert outputs == hf_greedy(model_dir, random_prompts(), MAX_NEW)


def test_each_rank_caches_half_the_kv_heads_and_a_killed_rank_is_named(tiny_model_dir):
    engine = build_engine(model=str(tiny_model_dir("llama")), tensor_parallel_size=2, kv_cache_memory="1MiB",
                          block_size=4, num_threads=1)
    try:
        # 2 layers x K and V x 1 of 2 KV heads x head_dim 16 x 4 bytes = 256 bytes a token, 1 KiB a block
        assert engine.worker_info.num_kv_blocks == 1024
        follower = dict((name, process) for name, process in engine.worker.watched())["tensor-parallel rank 1"]
        os.kill(follower.pid, signal.SIGKILL)
        started = time.monotonic()
        engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=4))
        with pytest.raises(WorkerDiedError, match=r"tensor-parallel rank 1 \(pid \d+\) exited with code -9"):
            while engine.has_unfinished_requests():
                engine.step()
        assert time.monotonic() - started < 5
    finally:
        engine.close()


def test_bench_offline_puts_tensor_and_data_parallel_side_by_side(tiny_model_dir, capsys):
    from radixlm.bench.offline import bench_offline

    results = bench_offline({"model": str(tiny_model_dir("llama")), "num_kv_blocks": 256, "block_size": 4}, 6,
                            (8, 24), (4, 8), [], 0, None, compare_data_parallel=True, compare_tensor_parallel=True)
    assert [r.engine for r in results] == ["radixlm 1 engine x 2 threads", "radixlm dp=2 x 1 thread",
                                           "radixlm tp=2 x 1 thread"]
    assert len({r.output_tokens for r in results}) == 1
    assert "radixlm tp=2 x 1 thread vs radixlm 1 engine x 2 threads" in capsys.readouterr().out
