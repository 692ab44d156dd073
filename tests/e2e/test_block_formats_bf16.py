"""GGUF block formats in a bfloat16 model (`--quantization q8_0 | q4_0 ... --dtype bfloat16`): the linears keep their
blocks and int8 activations (on a CPU with AMX, calls of many rows multiply the rows as they are by the weight
dequantized to bfloat16 instead), the kernel takes bfloat16 rows and rounds its float32 sums to bfloat16, the norms,
attention and KV cache are bfloat16. The PyTorch path (`GGUFLinear.reference_forward`) does the same arithmetic in
another summation order, so the same engine on it gives the same greedy tokens but where a bfloat16 rounding decides a
near tie: where two runs part, each had the other's token within a near tie of its own (their logprobs, the context
up to there being the same). HF's bfloat16 model is no judge here: it rounds its activations more often than either
run, which moves logits further apart than the two runs are."""

from __future__ import annotations

import pytest
import torch

from e2e.engine_runs import final_outputs
from e2e.test_greedy_matches_hf import BF16_NEAR_TIE, MAX_NEW, SCENARIOS, random_prompts
from radixlm.engine.llm_engine import build_engine
from radixlm.model import loader
from radixlm.model.gguf_linear import GGUFLinear
from radixlm.outputs import CompletionOutput
from radixlm.sampling_params import SamplingParams


@pytest.mark.parametrize("name", ["q8_0", "q4_0"])
def test_the_kernel_gives_the_pytorch_paths_tokens_in_bfloat16(name, tiny_model_dir, monkeypatch):
    model_dir = tiny_model_dir("llama")
    options = dict(model=str(model_dir), quantization=name, dtype="bfloat16", **SCENARIOS["chunked-prefill"])
    kernels = build_engine(**options)
    model = kernels.runner.model
    assert isinstance(model.lm_head, GGUFLinear) and model.lm_head.parts[0].tiles is not None
    assert model.model.norm.weight.dtype == torch.bfloat16
    assert kernels.runner.kv_cache.key_caches[0].dtype == torch.bfloat16
    monkeypatch.setattr(loader, "gguf_kernels", lambda: None)
    pytorch = build_engine(**options)
    assert pytorch.runner.model.lm_head.parts[0].rows is not None
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=5)
    ours, theirs = (final_outputs(engine, random_prompts(), params) for engine in (kernels, pytorch))
    diverged = [(o, t) for o, t in zip(ours, theirs, strict=True) if o.token_ids != t.token_ids]
    assert len(diverged) <= len(ours) // 4
    for mine, reference in diverged:
        first = next(i for i, (a, b) in enumerate(zip(mine.token_ids, reference.token_ids, strict=True)) if a != b)
        picks = mine.token_ids[first], reference.token_ids[first]
        for output, (chosen, other) in ((mine, picks), (reference, picks[::-1])):
            gap = _logprob_gap(output, first, chosen, other)
            assert gap < BF16_NEAR_TIE, f"parted at token {first}, where one engine had the tokens {gap:.4f} apart"


def _logprob_gap(output: CompletionOutput, position: int, chosen: int, other: int) -> float:
    """How far the run's pick led the other engine's at `position` (both ran the same tokens up to there): infinite
    when the other token is not among the run's top logprobs."""
    logprobs = output.logprobs[position]
    return logprobs[chosen].logprob - logprobs[other].logprob if other in logprobs else float("inf")
