"""Stops through the engine: stop strings finish through the scheduler (blocks freed), stop tokens, eos, min_tokens."""

import pytest

from e2e.engine_runs import run
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams

PROMPT = "the quick brown fox"
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=128, block_size=4)


@pytest.fixture(scope="module")
def free_run(engine):
    """The greedy continuation without stops: its tokens and each token's text."""
    output = run(engine, [("free", PROMPT, GREEDY)])["free"].sequences[0]
    pieces = []
    for end in range(1, len(output.token_ids) + 1):
        pieces.append(engine.tokenizer.decode(output.token_ids[:end]))
    return output, pieces


def stop_spanning_tokens(text, pieces):
    """A stop string of 3 characters that starts inside one token's text and ends in a later one."""
    for start in range(1, len(text) - 3):
        candidate = text[start:start + 3]
        first_token = next(i for i, piece in enumerate(pieces) if len(piece) > start)
        last_token = next(i for i, piece in enumerate(pieces) if len(piece) >= start + 3)
        if last_token > first_token and text.index(candidate) == start and "\ufffd" not in candidate:
            return candidate
    pytest.skip("no stop string spans tokens in this continuation")


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_finishes_through_the_scheduler(engine, free_run, include):
    output, pieces = free_run
    stop = stop_spanning_tokens(output.text, pieces)
    params = GREEDY.replace(stop=[stop], include_stop_str_in_output=include)
    result = run(engine, [("stopped", PROMPT, params)])["stopped"]  # run() checks every block came back
    final = result.sequences[0]
    cut = output.text.index(stop) + (len(stop) if include else 0)
    assert final.text == output.text[:cut]
    assert (final.finish_reason, final.stop_reason) == ("stop", stop)
    assert result.streamed_text[0] == final.text
    assert output.token_ids[:len(final.token_ids)] == final.token_ids
    assert len(final.token_ids) < len(output.token_ids)


def test_stop_token_ids_and_the_text_of_the_stopping_token(engine, free_run):
    output, _ = free_run
    stop_token = output.token_ids[5]
    assert stop_token not in output.token_ids[:5]
    final = run(engine, [("s", PROMPT, GREEDY.replace(stop_token_ids=[stop_token]))])["s"].sequences[0]
    assert final.token_ids == output.token_ids[:6]
    assert (final.finish_reason, final.stop_reason) == ("stop", stop_token)
    assert final.text == engine.tokenizer.decode(output.token_ids[:5])  # the stop token's text is not shown


def test_min_tokens_holds_back_eos(engine):
    eos = engine.tokenizer.eos_token_id
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=3, logit_bias={eos: 100.0})
    final = run(engine, [("e", PROMPT, params)])["e"].sequences[0]
    assert len(final.token_ids) == 4 and final.token_ids[-1] == eos and eos not in final.token_ids[:3]
    assert (final.finish_reason, final.stop_reason) == ("stop", None)
    ignoring = run(engine, [("i", PROMPT, params.replace(ignore_eos=True))])["i"].sequences[0]
    assert ignoring.token_ids == [eos] * 10 and ignoring.finish_reason == "length"
