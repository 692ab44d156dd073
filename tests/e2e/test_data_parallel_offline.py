"""`LLM(..., data_parallel_size=2)`: two replicas (workers in child processes) give the same greedy tokens as one
engine, spread random prompts, keep shared-prefix groups on one replica, and refuse a bad prompt whole."""

import random

import pytest

from radixlm.llm import LLM
from radixlm.sampling_params import SamplingParams

OPTIONS = {"num_kv_blocks": 256, "block_size": 4, "num_threads": 1}
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llms(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    one, two = LLM(model, **OPTIONS), LLM(model, data_parallel_size=2, **OPTIONS)
    yield one, two
    one.close()
    two.close()


def test_two_replicas_generate_what_one_engine_does(llms):
    one, two = llms
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(5, 60))] for _ in range(12)] + ["hello there"]
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, PARAMS, use_tqdm=False)]
    routed_before = list(two.engine.router.num_routed)
    got = [o.outputs[0].token_ids for o in two.generate(prompts, PARAMS, use_tqdm=False)]
    assert got == expected
    routed = [a - b for a, b in zip(two.engine.router.num_routed, routed_before, strict=True)]
    assert min(routed) >= 0.4 * len(prompts), routed
    assert two.engine.router.loads == [0, 0]
    assert not two.engine.has_unfinished_requests()


def test_shared_prefix_groups_stay_together(llms):
    _, two = llms
    rng = random.Random(1)
    prefixes = [[rng.randrange(3, 300) for _ in range(64)] for _ in range(4)]
    prompts = [prefix + [rng.randrange(3, 300) for _ in range(8)] for prefix in prefixes for _ in range(4)]
    engines = two.engine.engines
    computed_before = [e.scheduler.num_computed_prompt_tokens for e in engines]
    two.generate(prompts, SamplingParams(max_tokens=2), use_tqdm=False)
    computed = sum(e.scheduler.num_computed_prompt_tokens - b for e, b in zip(engines, computed_before, strict=True))
    assert computed <= 4 * (64 + 8) + 12 * 8 + 16, computed  # each prefix computed once (a few tokens of slack)


def test_a_bad_prompt_leaves_no_replica_with_work(llms):
    _, two = llms
    with pytest.raises(ValueError):
        two.generate([[5, 6, 7], [8, 9], [10**9]], PARAMS, use_tqdm=False)
    assert not two.engine.has_unfinished_requests()
    assert two.engine.router.loads == [0, 0]
    assert len(two.generate([[5, 6, 7]], PARAMS, use_tqdm=False)[0].outputs[0].token_ids) == 6


def test_bench_offline_compares_one_engine_with_two_replicas(tiny_model_dir, capsys):
    from radixlm.bench.offline import bench_offline

    results = bench_offline({"model": str(tiny_model_dir("llama")), "num_kv_blocks": 256, "block_size": 4}, 6,
                            (8, 24), (4, 8), [], 0, None, compare_data_parallel=True)
    assert [r.engine for r in results] == ["radixlm dp=1 x 2 threads", "radixlm dp=2 x 1 thread"]
    assert results[0].output_tokens == results[1].output_tokens
    assert "radixlm dp=2 x 1 thread vs radixlm dp=1 x 2 threads" in capsys.readouterr().out
