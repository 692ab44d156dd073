"""SmolLM2-135M-Instruct (the default model): greedy chat output equals HF generate token for token."""

import pytest

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy
from radixlm.config import DEFAULT_MODEL
from radixlm.engine.llm_engine import build_engine
from radixlm.model.loader import load_tokenizer, resolve_model_dir
from radixlm.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Write a haiku about the sea, the moon and the wind.",
    "List three prime numbers and explain in a few words why each one of them is prime.",
    "Translate to French: The cat sits on the mat and looks at the birds that sing in the old garden by the river.",
    "Explain what a KV cache is in a transformer language model, and why it makes generation faster. " * 2,
    "Count from one to twenty in words, separated by commas. " * 4,
    "You are a careful assistant. Summarise the following text in one sentence: " + (
        "Paged attention stores keys and values in fixed-size blocks so that memory is not wasted on padding. "
        "A block table maps each sequence's logical positions to physical blocks. ") * 6,
]
MAX_NEW = 32
SCENARIOS = {
    "all-at-once": dict(num_kv_blocks=512),
    "chunked-prefill": dict(num_kv_blocks=512, max_num_batched_tokens=48),
    "preemption": dict(num_kv_blocks=40, max_num_batched_tokens=256),
}


@pytest.fixture(scope="module")
def chat_prompts():
    tokenizer = load_tokenizer(resolve_model_dir(DEFAULT_MODEL))  # the engine's (its loader's), without a model
    prompts = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


@pytest.fixture(scope="module")
def references(chat_prompts):
    return hf_greedy(resolve_model_dir(DEFAULT_MODEL), chat_prompts, MAX_NEW, stop_at_eos=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_default_model_greedy_matches_hf(scenario, chat_prompts, references):
    assert len({len(p) for p in chat_prompts}) == len(chat_prompts)
    engine = build_engine(**SCENARIOS[scenario])
    outputs = output_token_ids(engine, chat_prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    assert outputs == references
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0
