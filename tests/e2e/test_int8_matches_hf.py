"""The int8 engine's greedy output equals HF generate on the same int8-quantized model (same quantized modules),
whatever the batching, chunking or preemption: int8 activations are quantized per token, so a row's output does not
depend on the rows it shares a forward with."""

import functools

import pytest

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy
from e2e.test_greedy_matches_hf import MAX_NEW, SCENARIOS, random_prompts
from radixlm.engine.llm_engine import build_engine
from radixlm.model.quantize import Int8Linear, quantize_model
from radixlm.sampling_params import SamplingParams

ARCHS = ["llama", "gemma2"]


def hf_int8_greedy(model_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    return hf_greedy(model_dir, prompts, max_new_tokens, prepare=lambda model: quantize_model(model, "int8"))


@pytest.fixture(scope="module")
def references(tiny_model_dir):
    """arch -> HF's greedy tokens, computed once per module."""
    return functools.cache(lambda arch: hf_int8_greedy(tiny_model_dir(arch), random_prompts(), MAX_NEW))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ARCHS)
def test_int8_greedy_matches_hf_int8(arch, scenario, tiny_model_dir, references):
    engine = build_engine(model=str(tiny_model_dir(arch)), quantization="int8", **SCENARIOS[scenario])
    assert isinstance(engine.runner.model.lm_head, Int8Linear)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    assert output_token_ids(engine, random_prompts(), params) == references(arch)
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0, "the scenario did not force preemption"
