"""n > 1 and best_of: one prompt forks into sequences that share its KV blocks, each with its own stream."""

import pytest
import torch

from e2e.engine_runs import drain, run
from radixlm.engine.llm_engine import build_engine
from radixlm.llm import LLM
from radixlm.sampling_params import SamplingParams

PROMPT = list(range(60, 70))  # 10 tokens: two full blocks of 4 and a partial one
PARAMS = SamplingParams(n=4, seed=77, temperature=1.0, max_tokens=12, ignore_eos=True)
ENGINE = dict(num_kv_blocks=128, block_size=4)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def four(model):
    engine = build_engine(model=model, **ENGINE)
    return run(engine, [("r", PROMPT, PARAMS)])["r"]


def test_the_pool_holds_one_copy_of_the_prompt_blocks(model):
    engine = build_engine(model=model, enable_prefix_caching=False, **ENGINE)
    engine.add_request("r", PROMPT, PARAMS)
    engine.step()  # computes the prompt, samples four first tokens, forks
    engine.check_invariants()
    sequences = [engine.scheduler.requests[sid] for sid in ("r", "r#1", "r#2", "r#3")]
    pool = engine.scheduler.kv_cache_manager.block_pool
    full_blocks = sequences[0].block_table[:2]
    for sequence in sequences:
        assert sequence.block_table[:2] == full_blocks  # the same physical blocks
        assert sequence.num_computed_tokens == len(PROMPT) and sequence.num_output_tokens == 1
    assert [pool.ref_count(b) for b in full_blocks] == [4, 4]
    tails = [sequence.block_table[2] for sequence in sequences]
    assert len(set(tails) | set(full_blocks)) == 6  # the partial block: one private copy per sequence
    assert [pool.ref_count(b) for b in tails] == [1, 1, 1, 1]
    cache = engine.runner.kv_cache  # each private tail holds a copy of the parent's 2 partial-block positions
    for layer_cache in (*cache.key_caches, *cache.value_caches):
        for tail in tails[1:]:
            assert torch.equal(layer_cache[tail * 4:tail * 4 + 2], layer_cache[tails[0] * 4:tails[0] * 4 + 2])
    drain(engine)


def test_four_sequences_differ_and_each_is_reproducible(model, four):
    outputs = [four.token_ids(i) for i in range(4)]
    assert all(len(tokens) == 12 for tokens in outputs)
    assert len({tuple(tokens) for tokens in outputs}) == 4
    again = run(build_engine(model=model, **ENGINE), [("r", PROMPT, PARAMS)])["r"]
    assert [again.token_ids(i) for i in range(4)] == outputs


def test_sequence_i_draws_the_stream_of_seed_plus_i(model, four):
    engine = build_engine(model=model, **ENGINE)
    singles = run(engine, [(f"s{i}", PROMPT, PARAMS.replace(n=1, seed=PARAMS.seed + i)) for i in range(4)])
    assert [singles[f"s{i}"].token_ids() for i in range(4)] == [four.token_ids(i) for i in range(4)]


def test_best_of_returns_the_n_most_likely_sequences(model):
    engine = build_engine(model=model, **ENGINE)
    results = run(engine, [("all", PROMPT, PARAMS.replace(logprobs=0)),
                           ("best", PROMPT, PARAMS.replace(n=2, best_of=4))])
    ranked = sorted(results["all"].sequences.values(), key=lambda s: -s.cumulative_logprob)
    best = results["best"]
    assert [best.token_ids(i) for i in range(2)] == [s.token_ids for s in ranked[:2]]
    assert len(best.sequences) == 2
    assert best.streamed_token_ids[0] == best.token_ids(0)  # nothing was streamed before the end


def test_streamed_outputs_carry_each_index(model):
    engine = build_engine(model=model, **ENGINE)
    result = run(engine, [("r", PROMPT, PARAMS.replace(max_tokens=5))])["r"]
    for index in range(4):
        assert result.streamed_token_ids[index] == result.token_ids(index)
        assert result.streamed_text[index] == result.sequences[index].text
        assert result.sequences[index].finish_reason == "length"


def test_abort_before_the_fork_finishes_every_sequence(model):
    engine = build_engine(model=model, **ENGINE)
    engine.add_request("r", PROMPT, PARAMS)
    output = engine.abort_request("r")
    assert output.finished and [c.finish_reason for c in output.outputs] == ["abort"] * 4
    assert not engine.has_unfinished_requests()
    engine.add_request("r", PROMPT, PARAMS)  # the ids are free again
    engine.step()
    output = engine.abort_request("r")
    assert output.finished and len(output.outputs) == 4
    drain(engine)


def test_llm_generate_returns_all_n_completions(model):
    llm = LLM(model=model, **ENGINE)
    outputs = llm.generate([PROMPT, PROMPT[:5]], SamplingParams(n=3, seed=1, max_tokens=4, ignore_eos=True),
                           use_tqdm=False)
    assert [[c.index for c in o.outputs] for o in outputs] == [[0, 1, 2], [0, 1, 2]]
    assert all(len(c.token_ids) == 4 and c.finish_reason == "length" for o in outputs for c in o.outputs)


def test_fork_without_a_spare_block_recomputes_the_partial_block(model):
    """The prompt fills the whole pool: the child shares the full blocks and recomputes the partial one."""
    params = PARAMS.replace(n=2, max_tokens=2)
    engine = build_engine(model=model, num_kv_blocks=3, block_size=4, enable_prefix_caching=False)
    engine.add_request("r", PROMPT, params)
    engine.step()
    child = engine.scheduler.requests["r#1"]
    assert len(child.block_table) == 2
    assert child.num_computed_tokens == 8 and child.num_uncomputed_tokens == 3
    forked = drain(engine)["r"]
    alone = build_engine(model=model, num_kv_blocks=3, block_size=4, enable_prefix_caching=False)
    singles = run(alone, [(f"s{i}", PROMPT, params.replace(n=1, seed=params.seed + i)) for i in range(2)])
    assert [forked.token_ids(i) for i in range(2)] == [singles[f"s{i}"].token_ids() for i in range(2)]


def test_a_child_that_ends_at_once_does_not_corrupt_the_next_request(model):
    """A fork's partial-block copy is made at once: a child finishing on its first token frees its block, which
    the next request may take for its own prefix copy in the very next step."""
    prompt = list(range(60, 70))  # 10 tokens with blocks of 4: the last block is partial
    follower = prompt[:6] + [100, 101, 102]  # its cache hit ends inside a block: it gets a copied block
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2)
    alone = build_engine(model=model, num_kv_blocks=64, block_size=4, enable_prefix_caching=False)
    alone.add_request("b", follower, greedy)
    expected = drain(alone)["b"]
    engine = build_engine(model=model, num_kv_blocks=4, block_size=4)
    engine.add_request("r", prompt, SamplingParams(n=2, seed=1, temperature=1.0, max_tokens=1, ignore_eos=True))
    engine.step()
    engine.add_request("b", follower, greedy)
    got = drain(engine)["b"]
    assert got.sequences[0].token_ids == expected.sequences[0].token_ids
    for position, reference in zip(got.sequences[0].logprobs, expected.sequences[0].logprobs, strict=True):
        assert position.keys() == reference.keys()
        assert all(abs(position[t].logprob - reference[t].logprob) < 1e-4 for t in position)
    assert got.output.num_cached_tokens == 6


def test_forked_sequences_stay_within_max_num_seqs(model, four):
    engine = build_engine(model=model, max_num_seqs=5, **ENGINE)
    engine.add_request("solo", PROMPT[:4], SamplingParams(seed=3, max_tokens=6, ignore_eos=True))
    engine.add_request("duo", PROMPT[:7], SamplingParams(seed=5, max_tokens=6, ignore_eos=True))
    engine.step()
    engine.add_request("r", PROMPT, PARAMS)  # four sequences: waits until two seats free up
    seen = set()
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            results[output.request_id] = output
        running = engine.scheduler.running
        assert len(running) <= 5
        seen.add(len(running))
    assert 4 in seen
    assert [results["r"].outputs[i].token_ids for i in range(4)] == [four.token_ids(i) for i in range(4)]
