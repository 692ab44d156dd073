"""GGUF block formats in a bfloat16 model (`--quantization q8_0 | q4_0 ... --dtype bfloat16`): the linears keep their
blocks and int8 activations, the kernel takes bfloat16 rows and rounds its float32 sums to bfloat16, and the norms,
attention and KV cache are bfloat16. The PyTorch path (`GGUFLinear.reference_forward`) does the same arithmetic in
another summation order, so the same engine on it gives the same greedy tokens but where a bfloat16 rounding decides a
near tie (HF's bfloat16 model on the same blocks, teacher-forced, measures the tie)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_logit_gap
from e2e.test_greedy_matches_hf import BF16_NEAR_TIE, MAX_NEW, SCENARIOS, random_prompts
from e2e.test_quantized_checkpoints import FORMATS, _round_trip
from radixlm.engine.llm_engine import build_engine
from radixlm.model import loader
from radixlm.model.gguf_linear import GGUFLinear
from radixlm.model.gguf_tiles import quantize_activations
from radixlm.sampling_params import SamplingParams


class _Bf16BlocksLinear(torch.nn.Module):
    """The GGUF linear's arithmetic on bfloat16 rows: int8 activations times the blocks' weights in float32, the sum
    rounded to the rows' dtype."""

    def __init__(self, linear: torch.nn.Linear, ggml_type: int) -> None:
        super().__init__()
        self.weight = _round_trip(linear.weight, ggml_type)
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(quantize_activations(x.float()), self.weight, self.bias).to(x.dtype)


def _bf16_blocks_reference(ggml_type: int):
    def prepare(model: torch.nn.Module) -> None:
        with torch.no_grad():
            embedding = model.get_input_embeddings()
            embedding.weight.copy_(_round_trip(embedding.weight, ggml_type))
            linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
            model.to(torch.bfloat16)
            for name, module in linears:
                parent_name, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent_name) if parent_name else model, child,
                        _Bf16BlocksLinear(module.float(), ggml_type))
    return prepare


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
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    ours, theirs = (output_token_ids(engine, random_prompts(), params) for engine in (kernels, pytorch))
    diverged = [(p, o, t) for p, o, t in zip(random_prompts(), ours, theirs, strict=True) if o != t]
    assert len(diverged) <= len(ours) // 4
    for prompt, mine, reference in diverged:
        first = next(i for i, (a, b) in enumerate(zip(mine, reference, strict=True)) if a != b)
        gap = hf_logit_gap(model_dir, prompt + reference[:first], reference[first], mine[first],
                           prepare=_bf16_blocks_reference(int(FORMATS[name])))
        assert gap < BF16_NEAR_TIE, f"parted at token {first} where the logits were {gap:.4f} apart"
