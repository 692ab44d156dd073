"""SmolLM2-135M-Instruct (the default model): seeded n > 1 chat sampling with stops and logprobs, end to end."""

import pytest

from e2e.engine_runs import run
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

QUESTION = "Name three colours, each in one short sentence."
PARAMS = SamplingParams(n=3, seed=11, temperature=0.8, top_p=0.9, top_k=50, repetition_penalty=1.05,
                        max_tokens=40, stop=[".", "\n\n"], logprobs=2)


def test_seeded_chat_samples_stop_and_reproduce():
    outputs = []
    for _ in range(2):
        engine = build_engine(num_kv_blocks=128, max_num_batched_tokens=32)  # chunked prompt
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                                    add_generation_prompt=True)
        prompt = engine.tokenizer.encode(text, add_special_tokens=False)
        outputs.append(run(engine, [("chat", prompt, PARAMS)])["chat"])
    first, second = outputs
    assert [first.token_ids(i) for i in range(3)] == [second.token_ids(i) for i in range(3)]
    assert len({tuple(first.token_ids(i)) for i in range(3)}) > 1
    assert "." in [first.sequences[i].stop_reason for i in range(3)]  # a sentence ended: the stop string cut it
    for index in range(3):
        sequence = first.sequences[index]
        assert first.streamed_text[index] == sequence.text
        assert "." not in sequence.text and "\n\n" not in sequence.text
        assert sequence.finish_reason in ("stop", "length")
        assert len(sequence.logprobs) == len(sequence.token_ids)
        assert all(token_id in position for token_id, position in
                   zip(sequence.token_ids, sequence.logprobs, strict=True))
