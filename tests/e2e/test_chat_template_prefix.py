"""Chat-template consistency (seed 001 §5.3): turn N's token ids are a prefix of turn N+1's, so multi-turn chat
hits the radix cache. Checked on the default model's template and with its real answers."""

import pytest

from radixlm import LLM, SamplingParams

pytestmark = pytest.mark.slow

TURNS = ["Hi! What is a radix tree?", "And how is it used for caching?", "Give one short example.",
         "Thanks, summarise in five words."]


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_each_turn_prompt_extends_the_previous_turn_and_hits_the_cache():
    llm = LLM(num_kv_blocks=256)
    messages = []
    previous: list[int] | None = None  # previous prompt + its generated answer
    previous_answer: list[int] = []
    params = SamplingParams(temperature=0.0, max_tokens=48)
    for turn, question in enumerate(TURNS):
        messages.append({"role": "user", "content": question})
        prompt_ids = llm.apply_chat_template(messages)
        output = llm.generate(prompt_ids, params, use_tqdm=False)[0]
        if previous is not None:
            shared = common_prefix_len(previous, prompt_ids)
            previous_prompt_len = len(previous) - len(previous_answer)
            assert shared >= previous_prompt_len, f"turn {turn}'s prompt does not extend turn {turn - 1}'s"
            # everything shared was computed last turn except the last answer token, whose K/V never is
            assert output.num_cached_tokens >= min(shared, len(previous) - 1) > previous_prompt_len
        previous_answer = output.outputs[0].token_ids
        previous = prompt_ids + previous_answer
        messages.append({"role": "assistant", "content": output.outputs[0].text})
