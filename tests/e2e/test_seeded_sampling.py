"""A seeded request draws the same tokens alone, inside a batch at another row, chunked, and after preemption."""

import pytest
import torch

from e2e.engine_runs import run
from radixlm.engine.llm_engine import build_engine
from radixlm.sampling_params import SamplingParams

SEEDED = SamplingParams(seed=1234, temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, repetition_penalty=1.1,
                        presence_penalty=0.2, max_tokens=24, ignore_eos=True)
SEEDED_PROMPT = list(range(40, 53))


def other_requests(num: int, seed: int = 5) -> list[tuple[str, list[int], SamplingParams]]:
    """A mixed crowd: unseeded and seeded, greedy, penalised, n > 1, varied prompt and output lengths."""
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for i in range(num):
        length = int(torch.randint(2, 30, (1,), generator=generator))
        prompt = torch.randint(3, 300, (length,), generator=generator).tolist()
        params = SamplingParams(temperature=[0.0, 0.7, 1.2, 1.0][i % 4], top_p=[1.0, 0.8][i % 2],
                                seed=i if i % 3 == 0 else None, frequency_penalty=0.3 if i % 5 == 0 else 0.0,
                                n=2 if i % 7 == 3 else 1, max_tokens=int(torch.randint(4, 30, (1,),
                                                                                       generator=generator)),
                                ignore_eos=True)
        requests.append((f"other-{i}", prompt, params))
    return requests


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def alone(model):
    engine = build_engine(model=model, num_kv_blocks=256, block_size=4)
    return run(engine, [("seeded", SEEDED_PROMPT, SEEDED)])["seeded"].token_ids()


def test_seeded_request_alone_has_its_length_and_varied_tokens(alone):
    assert len(alone) == SEEDED.max_tokens and len(set(alone)) > 5


def test_seeded_request_inside_a_batch_of_16_at_another_row(model, alone):
    engine = build_engine(model=model, num_kv_blocks=512, block_size=4, max_num_batched_tokens=16)
    others = other_requests(16)
    results = run(engine, [*others[:7], ("seeded", SEEDED_PROMPT, SEEDED), *others[7:]])
    assert results["seeded"].token_ids() == alone


def test_seeded_request_under_forced_preemption(model, alone):
    engine = build_engine(model=model, num_kv_blocks=40, block_size=4, max_num_batched_tokens=64)
    results = run(engine, [*other_requests(16, seed=9), ("seeded", SEEDED_PROMPT, SEEDED)])  # last in: the victim
    assert results["seeded"].output.metrics.num_preemptions > 0, "the seeded request was never preempted"
    assert results["seeded"].token_ids() == alone


def test_engine_seed_makes_unseeded_runs_reproducible(model):
    def tokens(engine_seed: int) -> dict[str, list[int]]:
        engine = build_engine(model=model, num_kv_blocks=256, block_size=4, seed=engine_seed)
        unseeded = [(i, p, params.replace(seed=None)) for i, p, params in other_requests(6, seed=3)]
        return {rid: r.token_ids() for rid, r in run(engine, unseeded).items()}

    first = tokens(7)
    assert tokens(7) == first
    assert tokens(8) != first
