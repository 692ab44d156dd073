"""Fused norms, MLPs and attention compute what transformers' modules compute."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixlm.model.fused_ops import FusedGatedMLP, FusedRMSNorm, fuse_small_ops

# arch -> modules replaced in a 2-layer model: 2 norms + MLP + attention per layer, the final norm
EXPECTED = {"llama": 2 * 4 + 1, "mistral": 2 * 4 + 1, "qwen2": 2 * 4 + 1, "qwen3": 2 * 5 + 1, "gemma2": 0}


@pytest.mark.parametrize("arch", EXPECTED)
def test_fused_model_matches_transformers(arch, tiny_model_dir):
    model_dir = tiny_model_dir(arch)
    implementation = "eager" if arch == "gemma2" else "sdpa"  # the fused forward looks up registered functions
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=implementation)
    fused = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=implementation)
    assert fuse_small_ops(fused) == EXPECTED[arch]  # qwen3's q/k norms are fused too; its attention is not
    if EXPECTED[arch]:
        assert isinstance(fused.model.norm, FusedRMSNorm)
        assert isinstance(fused.model.layers[0].mlp, FusedGatedMLP)
    input_ids = torch.randint(3, 300, (1, 37), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = reference(input_ids, use_cache=False).logits
        actual = fused(input_ids, use_cache=False).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))
