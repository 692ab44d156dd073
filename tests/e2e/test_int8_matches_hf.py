"""The int8 engine's greedy output is the same whatever the batching, chunking or preemption (int8 activations are
quantized per token and every row attends like a decode, so a row's output does not depend on the rows it shares a
forward with), and equals HF generate on the same int8-quantized model (same quantized modules) up to near-ties:
attention's float sums differ from HF's in the last bits, and the per-token activation rounding can turn that into
a different token where two logits were within `NEAR_TIE` of each other."""

import functools

import pytest

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy, hf_logit_gap
from e2e.test_greedy_matches_hf import MAX_NEW, SCENARIOS, random_prompts
from radixlm.engine.llm_engine import build_engine
from radixlm.model.quantize import Int8Linear, quantize_model
from radixlm.sampling_params import SamplingParams

ARCHS = ["llama", "gemma2"]
NEAR_TIE = 0.02  # logits (of magnitude ~5 here) this close may swap places under last-bit attention differences


def hf_int8_greedy(model_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    return hf_greedy(model_dir, prompts, max_new_tokens, prepare=lambda model: quantize_model(model, "int8"))


@pytest.fixture(scope="module")
def references(tiny_model_dir):
    """arch -> HF's greedy tokens, computed once per module."""
    return functools.cache(lambda arch: hf_int8_greedy(tiny_model_dir(arch), random_prompts(), MAX_NEW))


@pytest.fixture(scope="module")
def engine_outputs(tiny_model_dir):
    """arch -> the engine's greedy tokens in the first scenario, which every scenario must reproduce."""
    def run_first(arch: str) -> list[list[int]]:
        engine = build_engine(model=str(tiny_model_dir(arch)), quantization="int8",
                              **next(iter(SCENARIOS.values())))
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        return output_token_ids(engine, random_prompts(), params)
    return functools.cache(run_first)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ARCHS)
def test_int8_greedy_matches_hf_int8(arch, scenario, tiny_model_dir, references, engine_outputs):
    engine = build_engine(model=str(tiny_model_dir(arch)), quantization="int8", **SCENARIOS[scenario])
    assert isinstance(engine.runner.model.lm_head, Int8Linear)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = output_token_ids(engine, random_prompts(), params)
    assert outputs == engine_outputs(arch)  # every scenario gives the same tokens
    num_diverged = 0
    for prompt, ours, theirs in zip(random_prompts(), outputs, references(arch), strict=True):
        if ours == theirs:
            continue
        num_diverged += 1
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        gap = hf_logit_gap(tiny_model_dir(arch), prompt + theirs[:first], theirs[first], ours[first],
                           prepare=lambda model: quantize_model(model, "int8"))
        assert gap < NEAR_TIE, f"diverged from HF at token {first} where HF's logits were {gap:.4f} apart"
    assert num_diverged <= 1
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0, "the scenario did not force preemption"


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_prefix_hits_give_the_same_tokens(arch, tiny_model_dir, engine_outputs):
    """Every prompt twice in one run: a copy waits a step and finds the first one's blocks cached, so it computes
    only its last token (a one-token chunk) or its last partial block. The tokens do not change."""
    engine = build_engine(model=str(tiny_model_dir(arch)), quantization="int8", num_kv_blocks=256, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = output_token_ids(engine, random_prompts() * 2, params)
    num_prompts = len(random_prompts())
    assert outputs[:num_prompts] == outputs[num_prompts:] == engine_outputs(arch)
    assert engine.scheduler.kv_cache_manager.stats.num_hit_tokens > 0
