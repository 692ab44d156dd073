"""Logprobs and prompt logprobs are HF's raw log-softmax, whatever the chunking or preemption, never duplicated."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from e2e.engine_runs import run
from radixlm.engine.llm_engine import build_engine
from radixlm.request import Request
from radixlm.sampling_params import SamplingParams

PROMPT_LENS = [9, 23, 2, 31, 1, 17]
SCENARIOS = {
    "all-at-once": dict(num_kv_blocks=256, block_size=4),
    "chunked-prefill": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=7),
    "preemption": dict(num_kv_blocks=20, block_size=4, max_num_batched_tokens=64),
}
# Sampled with penalties and a bias: logprobs must still be those of the raw model distribution.
PARAMS = SamplingParams(temperature=1.3, top_k=20, repetition_penalty=1.3, logit_bias={5: 5.0}, seed=3,
                        max_tokens=10, ignore_eos=True, logprobs=4, prompt_logprobs=3)


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(3, 300, (n,), generator=generator).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir("qwen2"), dtype=torch.float32).eval()


def hf_logprobs(model, token_ids: list[int]) -> torch.Tensor:
    """Row p: log-softmax of the logits at position p (the distribution of token p + 1)."""
    with torch.inference_mode():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_position(position, token_id, reference, num_top):
    assert token_id in position
    assert math.isclose(position[token_id].logprob, reference[token_id].item(), abs_tol=2e-4)
    value = reference[token_id]
    assert 1 + (reference > value + 1e-4).sum() <= position[token_id].rank <= 1 + (reference > value - 1e-4).sum()
    top = sorted((lp.logprob for lp in position.values() if lp.rank <= num_top), reverse=True)
    assert len(position) in (num_top, num_top + 1)
    assert torch.allclose(torch.tensor(top), reference.topk(num_top).values, atol=2e-4)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_logprobs_equal_hf(scenario, tiny_model_dir, hf_model):
    engine = build_engine(model=str(tiny_model_dir("qwen2")), enable_prefix_caching=False, **SCENARIOS[scenario])
    results = run(engine, [(f"r{i}", p, PARAMS) for i, p in enumerate(prompts())])
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0
    for i, prompt in enumerate(prompts()):
        result = results[f"r{i}"]
        output = result.sequences[0]
        reference = hf_logprobs(hf_model, prompt + output.token_ids)
        prompt_logprobs = result.output.prompt_logprobs
        assert len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None  # none twice, none missing
        for j in range(1, len(prompt)):
            assert_position(prompt_logprobs[j], prompt[j], reference[j - 1], PARAMS.prompt_logprobs)
        assert len(output.logprobs) == len(output.token_ids) == PARAMS.max_tokens
        for t, token_id in enumerate(output.token_ids):
            assert_position(output.logprobs[t], token_id, reference[len(prompt) - 1 + t], PARAMS.logprobs)
        assert math.isclose(output.cumulative_logprob, sum(p[t].logprob for p, t in
                                                           zip(output.logprobs, output.token_ids, strict=True)),
                            abs_tol=1e-4)
        assert result.streamed_token_ids[0] == output.token_ids


def test_logprobs_zero_returns_only_the_chosen_token(tiny_model_dir):
    engine = build_engine(model=str(tiny_model_dir("qwen2")), num_kv_blocks=64, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=0, ignore_eos=True)
    output = run(engine, [("r", [5, 6, 7], params)])["r"].sequences[0]
    assert [list(p) for p in output.logprobs] == [[t] for t in output.token_ids]
    assert all(p[t].rank == 1 for p, t in zip(output.logprobs, output.token_ids, strict=True))  # greedy
    assert all(p[t].decoded_token is not None for p, t in zip(output.logprobs, output.token_ids, strict=True))


def test_prompt_logprobs_are_complete_when_the_prompt_is_cached(tiny_model_dir):
    engine = build_engine(model=str(tiny_model_dir("qwen2")), num_kv_blocks=64, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    prompt = prompts()[3]
    engine.add_request("a", prompt, params.replace(prompt_logprobs=None))
    while engine.has_unfinished_requests():
        engine.step()
    probe = Request("probe", prompt, SamplingParams())
    assert engine.scheduler.kv_cache_manager.cached_prefix_length(probe) > 0  # the prompt is in the radix tree
    again = run(engine, [("b", prompt, params)])["b"].output
    assert again.prompt_logprobs[0] is None and all(p is not None for p in again.prompt_logprobs[1:])
    assert len(again.prompt_logprobs) == len(prompt)
