"""Embeddings equal HF's `last_hidden_state` pooled the same way (last token or mean) and L2-normalized, within 1e-5
in float32, however the engine batches them: chunked prefill, mixed with generation requests (whose greedy tokens
stay HF's), preempted, after prefix-cache hits, with speculative decoding on, in a worker process, with tensor and
data parallelism."""

import functools

import pytest
import torch

from e2e.engine_runs import assert_all_blocks_released, drain
from e2e.hf_reference import hf_embeddings, hf_greedy
from e2e.test_greedy_matches_hf import MAX_NEW, random_prompts
from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.llm import LLM
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams

TOLERANCE = 1e-5
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
SCENARIOS = {
    "all-at-once": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=2048),
    "chunked-prefill": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=7),
}


@pytest.fixture(scope="module")
def references(tiny_model_dir):
    """(arch, pooling, prompt seed) -> HF's vectors of `random_prompts(seed)`."""
    return functools.cache(lambda arch, pooling, seed=1: hf_embeddings(tiny_model_dir(arch), random_prompts(seed),
                                                                      pooling))


def max_difference(vectors: list[list[float]], expected: list[list[float]]) -> float:
    assert [len(v) for v in vectors] == [len(e) for e in expected]
    return max((torch.tensor(v) - torch.tensor(e)).abs().max().item() for v, e in zip(vectors, expected, strict=True))


def embed_all(engine: LLMEngine, prompts: list[list[int]], params: PoolingParams | None = None) -> list[list[float]]:
    """Run embedding requests to the end (invariants after every step, no block leaked); their vectors in order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"emb-{i}", prompt, params or PoolingParams())
    results = drain(engine)
    for i in range(len(prompts)):
        output = results[f"emb-{i}"].output
        assert output.finished and output.error is None and output.outputs[0].finish_reason == "stop"
        assert output.outputs[0].token_ids == []  # nothing generated
    return [results[f"emb-{i}"].output.embedding for i in range(len(prompts))]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_embeddings_equal_hf(arch, pooling, scenario, tiny_model_dir, references):
    engine = build_engine(model=str(tiny_model_dir(arch)), pooling=pooling, **SCENARIOS[scenario])
    vectors = embed_all(engine, random_prompts())  # the engine's --pooling
    assert max_difference(vectors, references(arch, pooling)) < TOLERANCE
    assert all(abs(torch.tensor(v).norm().item() - 1) < 1e-5 for v in vectors)


def test_the_torch_attention_backend_gives_the_same_vectors(tiny_model_dir, references):
    engine = build_engine(model=str(tiny_model_dir("llama")), attention_backend="torch", **SCENARIOS["chunked-prefill"])
    assert max_difference(embed_all(engine, random_prompts(), PoolingParams("mean")),
                          references("llama", "mean")) < TOLERANCE


MIXED = {
    "chunked-prefill": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=16),
    "preemption": dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("scenario", MIXED)
def test_a_batch_mixing_embeddings_and_generation_keeps_both_exact(scenario, tiny_model_dir, references):
    model_dir = tiny_model_dir("llama")
    engine = build_engine(model=str(model_dir), pooling="mean", **MIXED[scenario])
    generated, embedded = random_prompts(), random_prompts(seed=3)
    for i in range(len(generated)):  # interleaved arrivals: the later ones are the first preemption victims
        engine.add_request(f"gen-{i}", generated[i], GREEDY)
        engine.add_request(f"emb-{i}", embedded[i], PoolingParams())
    mixed_steps = 0
    original_step = engine.step

    def step():
        nonlocal mixed_steps
        outputs = original_step()
        last = engine.last_scheduler_output
        mixed_steps += bool(last and last.sampling_request_ids and any(c.request_id.startswith("emb") for c in
                                                                         last.chunks))
        return outputs

    engine.step = step
    results = drain(engine)
    assert mixed_steps > 0, "no step ran embedding and generation chunks together"
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0, "the scenario did not force preemption"
    assert [results[f"gen-{i}"].token_ids() for i in range(len(generated))] == hf_greedy(model_dir, generated,
                                                                                         MAX_NEW)
    vectors = [results[f"emb-{i}"].output.embedding for i in range(len(embedded))]
    assert max_difference(vectors, references("llama", "mean", 3)) < TOLERANCE


def test_prefix_cache_hits_serve_last_pooling_and_mean_pooling_computes_every_token(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    engine = build_engine(model=str(model_dir), num_kv_blocks=256, block_size=4)
    generator = torch.Generator().manual_seed(9)
    prefix = torch.randint(3, 300, (30,), generator=generator).tolist()
    prompts = [prefix + torch.randint(3, 300, (n,), generator=generator).tolist() for n in (3, 7)]
    engine.add_request("warm", prefix + [5], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():  # not `drain`: it empties the prefix cache at the end
        engine.step()
    for pooling in ("last", "mean"):
        outputs = []
        for i, prompt in enumerate(prompts):
            engine.add_request(f"{pooling}-{i}", prompt, PoolingParams(pooling))
        while engine.has_unfinished_requests():
            outputs += [o for o in engine.step() if o.finished]
        engine.check_invariants()
        outputs.sort(key=lambda o: o.request_id)
        cached = [o.num_cached_tokens for o in outputs]
        assert all(n >= 28 for n in cached) if pooling == "last" else cached == [0, 0], (pooling, cached)
        assert max_difference([o.embedding for o in outputs], hf_embeddings(model_dir, prompts, pooling)) < TOLERANCE
    assert_all_blocks_released(engine)


def test_an_aborted_embedding_request_ends_without_a_vector(tiny_model_dir):
    engine = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=4,
                          max_num_batched_tokens=8)
    engine.add_request("long", random_prompts()[4], PoolingParams("mean"))
    engine.add_request("short", [5, 6, 7], PoolingParams("mean"))
    engine.step()
    assert engine.scheduler.requests["long"].num_computed_tokens > 0
    final = engine.abort_request("long")
    assert final.finished and final.embedding is None and final.outputs[0].finish_reason == "abort"
    results = drain(engine)
    assert results["short"].output.embedding is not None and "long" not in results
    assert_all_blocks_released(engine)


def test_speculative_decoding_never_drafts_for_embeddings(tiny_model_dir, references):
    model_dir = tiny_model_dir("llama")
    engine = build_engine(model=str(model_dir), num_kv_blocks=256, block_size=4, max_num_batched_tokens=32,
                          speculative_config='{"num_speculative_tokens": 3}')
    repeating = [[7, 8, 9, 10] * 6, [11, 12] * 9]
    for i, prompt in enumerate(repeating):
        engine.add_request(f"gen-{i}", prompt, GREEDY)
    for i, prompt in enumerate(random_prompts()):
        engine.add_request(f"emb-{i}", prompt, PoolingParams("last"))
    original_step = engine.step

    def step():
        outputs = original_step()
        last = engine.last_scheduler_output
        assert last is None or not any(c.num_draft_tokens for c in last.chunks if c.request_id.startswith("emb"))
        return outputs

    engine.step = step
    results = drain(engine)
    assert engine.drafter.stats.num_drafts > 0, "nothing was drafted: the test proves nothing"
    assert [results[f"gen-{i}"].token_ids() for i in range(2)] == hf_greedy(model_dir, repeating, MAX_NEW)
    vectors = [results[f"emb-{i}"].output.embedding for i in range(len(random_prompts()))]
    assert max_difference(vectors, references("llama", "last")) < TOLERANCE


def test_a_request_whose_pooling_fails_fails_alone(tiny_model_dir, monkeypatch):
    import radixlm.worker.worker as worker_module

    real = worker_module.embedding_of

    def failing(pooled, num_positions, pooling_type):
        if num_positions == 3:
            raise ValueError("the model's hidden states are not finite (NaN or infinity)")
        return real(pooled, num_positions, pooling_type)

    monkeypatch.setattr(worker_module, "embedding_of", failing)
    engine = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=4)
    engine.add_request("bad", [5, 6, 7], PoolingParams())
    engine.add_request("good", [5, 6, 7, 8], PoolingParams())
    results = drain(engine)
    assert "not finite" in results["bad"].output.error and results["bad"].output.embedding is None
    assert results["good"].output.error is None and len(results["good"].output.embedding) == 64


def test_llm_embed_returns_the_vectors_in_prompt_order(tiny_model_dir, references):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=4, pooling="mean")
    vectors = llm.embed(random_prompts(), use_tqdm=False)
    assert max_difference(vectors, references("llama", "mean")) < TOLERANCE
    assert max_difference(llm.embed(random_prompts(), PoolingParams("last"), use_tqdm=False),
                          references("llama", "last")) < TOLERANCE
    text = llm.embed("the quick brown fox", use_tqdm=False)
    assert len(text) == 1 and len(text[0]) == 64


def test_a_worker_process_and_tensor_parallel_ranks_give_the_same_vectors(tiny_model_dir, references):
    model = str(tiny_model_dir("llama"))
    for options in ({"distributed_executor_backend": "mp"}, {"tensor_parallel_size": 2}):
        engine = build_engine(model=model, num_kv_blocks=256, block_size=4, max_num_batched_tokens=16, num_threads=1,
                              **options)
        try:
            vectors = embed_all(engine, random_prompts(), PoolingParams("mean"))
        finally:
            engine.close()
        assert max_difference(vectors, references("llama", "mean")) < TOLERANCE, options


def test_data_parallel_replicas_give_the_same_vectors(tiny_model_dir, references):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=4, num_threads=1, data_parallel_size=2)
    try:
        vectors = llm.embed(random_prompts(), use_tqdm=False)
    finally:
        llm.close()
    assert max_difference(vectors, references("llama", "last")) < TOLERANCE
