"""The offline `LLM.generate` contract: a rejected prompt rejects the whole call and leaves nothing queued."""

import pytest

from radixlm.llm import LLM
from radixlm.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def test_a_rejected_prompt_leaves_no_earlier_prompt_of_the_call_queued(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=4, max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[5, 6, 7], [8, 9], list(range(40))], PARAMS, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert not llm.engine.scheduler.requests
    llm.engine.check_invariants()
    outputs = llm.generate([[5, 6, 7]], PARAMS, use_tqdm=False)  # the engine still serves the next call
    assert len(outputs) == 1 and len(outputs[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("bad", [None, [True, 5], b"ab", {5: 1}, [5, 2.0]])
def test_a_prompt_that_is_neither_text_nor_token_ids_is_a_value_error(tiny_model_dir, bad):
    llm = LLM(model=str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=4, max_model_len=32)
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([[5, 6, 7], bad], PARAMS, use_tqdm=False)
    assert not llm.engine.scheduler.requests
