"""The step contract: a worker in another process, fed only pickled steps, gives the tokens of the in-process one;
a running decode costs a few dozen bytes a step; a chunk of k known tokens is verified in one step (drafts), keeps
exactly the greedy tokens, caches only final tokens in the radix tree and trims the blocks of rejected ones."""

import pickle

import pytest

from e2e.engine_runs import run
from e2e.hf_reference import hf_greedy
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams

ENGINE = dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=64)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
REQUESTS = [
    ("greedy", list(range(10, 31)), GREEDY),
    ("seeded", list(range(40, 47)), SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=10,
                                                   ignore_eos=True, logprobs=2)),
    ("n3", list(range(50, 69)), SamplingParams(n=3, temperature=0.8, seed=11, max_tokens=8, ignore_eos=True)),
    ("penalized", list(range(70, 75)), SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=9,
                                                      ignore_eos=True, prompt_logprobs=1, min_tokens=4)),
]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def summary(finished):
    return {request_id: ([f.token_ids(i) for i in sorted(f.sequences)], f.output.prompt_logprobs,
                         [f.sequences[i].logprobs for i in sorted(f.sequences)]) for request_id, f in finished.items()}


def test_a_worker_process_fed_pickled_steps_gives_the_in_process_tokens(model):
    in_process = summary(run(build_engine(model=model, **ENGINE), REQUESTS))
    engine = build_engine(model=model, distributed_executor_backend="mp", **ENGINE)
    try:
        assert summary(run(engine, REQUESTS)) == in_process
        # and a second round reuses the worker's cache state (prefix hits, forgotten requests)
        assert summary(run(engine, REQUESTS)) == in_process
    finally:
        engine.close()


def test_a_running_decode_batch_of_64_costs_under_4_kb_a_step(model):
    engine = build_engine(model=model, num_kv_blocks=1024, block_size=16, max_num_seqs=64,
                          max_num_batched_tokens=4096)
    for i in range(64):
        engine.add_request(f"user-{i:02d}", list(range(3 + i, 60 + i)), SamplingParams(temperature=0.7, seed=i,
                                                                                       max_tokens=40, ignore_eos=True))
    engine.step()  # every prompt in one step: 64 new requests, sent whole
    first_bytes = len(pickle.dumps(engine.last_scheduler_output, protocol=pickle.HIGHEST_PROTOCOL))
    sizes = []
    for _ in range(20):
        engine.step()
        output = engine.last_scheduler_output
        assert len(output.chunks) == 64 and output.num_scheduled_tokens == 64
        sizes.append(len(pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL)))
    print(f"\nstep input bytes, 64 requests: first step (prompts) {first_bytes}, decode steps "
          f"min {min(sizes)} / max {max(sizes)} (with a new block every 16 tokens)")
    assert max(sizes) < 4096


def test_a_chunk_of_known_tokens_is_verified_in_one_step(model, tiny_model_dir):
    prompt = list(range(20, 33))  # 13 tokens: blocks of 4
    reference = hf_greedy(tiny_model_dir("llama"), [prompt], 16)[0]
    engine = build_engine(model=model, **ENGINE)
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    engine.step()
    request = engine.scheduler.requests["r"]
    assert request.output_token_ids == reference[:1]
    # Four drafts: two right, then a wrong one (and one after it that must not count).
    wrong = (reference[3] + 1) % 300
    request.draft_token_ids = [reference[1], reference[2], wrong, reference[4]]
    engine.step()
    output = engine.last_scheduler_output
    (chunk,) = output.chunks
    assert (chunk.num_tokens, chunk.num_sampled) == (5, 5)
    assert request.output_token_ids == reference[:4]  # 2 drafts kept, then the model's own token
    assert request.num_computed_tokens == len(prompt) + 3  # the wrong draft's K/V do not count
    manager = engine.scheduler.kv_cache_manager
    assert len(request.block_table) == -(-request.num_tokens // 4)  # the blocks of rejected positions are freed
    # The tree holds exactly the final tokens computed so far, never a rejected draft.
    assert manager.radix_cache.match_length(request.all_token_ids) == request.num_computed_tokens
    assert manager.radix_cache.match_length(prompt + reference[:3] + [wrong]) == len(prompt) + 3
    engine.check_invariants()
    # All drafts right: every one is kept, plus one more.
    request.draft_token_ids = reference[4:8]
    engine.step()
    assert request.output_token_ids == reference[:9]
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_invariants()
    assert engine.output_processor.parents == {} and request.output_token_ids == reference


def test_seeded_sampling_with_drafts_draws_the_tokens_of_plain_decoding(model):
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=14, ignore_eos=True)
    plain = run(build_engine(model=model, **ENGINE), [("s", list(range(5, 17)), params)])["s"].token_ids()
    engine = build_engine(model=model, **ENGINE)
    engine.add_request("s", list(range(5, 17)), params)
    engine.step()
    request = engine.scheduler.requests["s"]
    patterns = ["right", "half", "right", "wrong", "right"]
    while engine.has_unfinished_requests():
        if patterns and "s" in engine.scheduler.requests:
            n, pattern = request.num_output_tokens, patterns.pop(0)
            right = plain[n:n + 3]
            request.draft_token_ids = {"right": right, "half": right[:1] + [t + 1 for t in right[1:]],
                                       "wrong": [t + 1 for t in right]}[pattern]
        engine.step()
        engine.check_invariants()
    assert request.output_token_ids == plain
