"""Fused norms, MLPs and attention compute what transformers' modules compute."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixlm.model.bf16_linear import amx_available
from radixlm.model.fused_ops import FusedGatedMLP, FusedRMSNorm, fuse_small_ops
from radixlm.model.ops import extension, extension_error

needs_extension = pytest.mark.skipif(extension_error() is not None, reason="radixlm._C is not built")

# arch -> modules replaced in a 2-layer model: 2 norms + MLP + attention + the layer's own forward per layer, the
# final norm (qwen3: 2 norms + its q and k norms + MLP per layer; its attention and layers keep transformers' code)
EXPECTED = {"llama": 2 * 5 + 1, "mistral": 2 * 5 + 1, "qwen2": 2 * 5 + 1, "qwen3": 2 * 5 + 1, "gemma2": 0}


@pytest.mark.parametrize("cpp_kernels", [False, pytest.param(True, marks=needs_extension)])
@pytest.mark.parametrize("arch", EXPECTED)
def test_fused_model_matches_transformers(arch, cpp_kernels, tiny_model_dir):
    model_dir = tiny_model_dir(arch)
    implementation = "eager" if arch == "gemma2" else "sdpa"  # the fused forward looks up registered functions
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=implementation)
    fused = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=implementation)
    # qwen3's q/k norms are fused too; its attention is not
    assert fuse_small_ops(fused, cpp_kernels=cpp_kernels) == EXPECTED[arch]
    if EXPECTED[arch]:
        assert isinstance(fused.model.norm, FusedRMSNorm)
        assert (fused.model.norm._kernel is not None) == cpp_kernels
        if arch != "qwen3":
            assert (fused.model.layers[0].self_attn.rotary_kernel is not None) == cpp_kernels
        assert ("forward" in vars(fused.model.layers[0])) == (arch != "qwen3")
        assert isinstance(fused.model.layers[0].mlp, FusedGatedMLP)
    input_ids = torch.randint(3, 300, (1, 37), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = reference(input_ids, use_cache=False).logits
        actual = fused(input_ids, use_cache=False).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))


@needs_extension
@pytest.mark.parametrize("features", [576, 64, 17, 1, 4096])
def test_cpp_norm_is_bit_identical_to_transformers(features):
    """Every output bit of radixlm._C's RMSNorm equals transformers' float32 module, for 1 to 2,048 rows, small and
    large magnitudes, 2-D and head-shaped 4-D inputs (Qwen3's q/k norms), and a non-contiguous input."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(features)
    reference = LlamaRMSNorm(features, eps=1e-6)
    with torch.no_grad():
        reference.weight.copy_(torch.randn(features))
    norm = fuse_small_ops_of(reference)
    assert norm._kernel is not None
    inputs = [torch.randn(rows, features) * scale for rows in (1, 3, 64, 2048) for scale in (1e-3, 1.0, 40.0)]
    inputs += [torch.randn(1, 5, 3, features), torch.randn(features, 4).t(), torch.zeros(2, features),
               torch.randn(0, features)]
    with torch.inference_mode():
        for x in inputs:
            expected = reference(x)
            actual = norm(x)
            assert actual.shape == expected.shape and torch.equal(actual, expected)


def fuse_small_ops_of(norm: torch.nn.Module) -> FusedRMSNorm:
    """`norm` replaced by its fused version, with the C++ kernel."""
    holder = torch.nn.Sequential(norm)
    assert fuse_small_ops(holder, cpp_kernels=True) == 1
    return holder[0]


@needs_extension
def test_cpp_norm_refuses_bad_arguments():
    kernels = extension()
    weight = torch.randn(16)
    with pytest.raises(RuntimeError, match="weight must be contiguous"):
        kernels.rms_norm(torch.randn(2, 15), weight, 1e-6)
    with pytest.raises(RuntimeError, match="float32"):
        kernels.rms_norm(torch.randn(2, 16, dtype=torch.float64), weight, 1e-6)
    with pytest.raises(RuntimeError, match="dense CPU tensor"):
        kernels.rms_norm(torch.randn(2, 16, device="meta"), weight, 1e-6)
    with pytest.raises(TypeError):
        kernels.rms_norm(torch.randn(2, 16), weight, "eps")
    with pytest.raises(TypeError, match="3 arguments"):
        kernels.rms_norm(torch.randn(2, 16), weight)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = fuse_small_ops_of(LlamaRMSNorm(16))
    x = torch.randn(2, 16, requires_grad=True)  # autograd on: the module takes F.rms_norm, which has a backward
    norm(x).sum().backward()
    assert x.grad is not None


@needs_extension
@pytest.mark.parametrize("head_dim", [64, 8, 2])
def test_cpp_rotary_is_bit_identical_to_transformers(head_dim):
    """radixlm._C's rotary embedding equals transformers' `apply_rotary_pos_emb` bit for bit, on the strided
    [B, H, T, D] view of a fused q/k/v projection, at one token and at a prefill's 300."""
    kernels = extension()
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(head_dim)
    for tokens in (1, 7, 300):
        for heads, total in ((9 + 3, 9 + 6), (2 + 1, 2 + 2)):
            qkv = (torch.randn(1, tokens, total * head_dim) * 3).view(1, tokens, total, head_dim).transpose(1, 2)
            query_key = qkv[:, :heads]
            angles = torch.randn(1, tokens, head_dim // 2) * 50
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            expected, _ = apply_rotary_pos_emb(query_key, query_key, cos, sin)
            actual = kernels.rotary(query_key, cos, sin)
            assert actual.shape == expected.shape and torch.equal(actual, expected)
            assert torch.equal(torch.ops.radixlm.rotary(query_key, cos, sin), expected)
    pair = torch.randn(2, 3, 5, head_dim)  # two sequences, one set of positions broadcast over both
    expected, _ = apply_rotary_pos_emb(pair, pair, cos[:, :5], sin[:, :5])
    assert torch.equal(kernels.rotary(pair, cos[:, :5], sin[:, :5]), expected)


@needs_extension
def test_cpp_rotary_refuses_bad_arguments():
    kernels = extension()
    query_key, cos = torch.randn(1, 3, 4, 8), torch.randn(1, 4, 8)
    with pytest.raises(RuntimeError, match="cos and sin"):
        kernels.rotary(query_key, cos, torch.randn(1, 5, 8))
    with pytest.raises(RuntimeError, match="even"):
        kernels.rotary(torch.randn(1, 3, 4, 7), torch.randn(1, 4, 7), torch.randn(1, 4, 7))
    with pytest.raises(RuntimeError, match="D contiguous"):
        kernels.rotary(torch.randn(1, 3, 8, 4).transpose(2, 3), cos, cos)
    with pytest.raises(RuntimeError, match="dense CPU tensor"):
        kernels.rotary(query_key.to("meta"), cos, cos)
    with pytest.raises(RuntimeError, match="float32"):
        kernels.rotary(query_key.double(), cos, cos)
    with pytest.raises(TypeError, match="must be a tensor"):
        kernels.rotary(query_key, cos, None)


@pytest.mark.skipif(not amx_available(), reason="needs radixlm._C and a CPU with AMX-BF16")
def test_gated_mlp_on_interleaved_halves_computes_the_same():
    """`interleave_halves` reorders the gate/up weight by blocks of 16 and runs silu in the AMX kernel's writes for
    bfloat16 rows (in chunks above 320), the blocks' silu after the projection for float32 rows, the torch path with
    autograd: every path within a bfloat16 rounding of the plain MLP's float32 result; LoRA adapters' set-up puts the
    weight back bit for bit."""
    import torch.nn.functional as F
    from torch import nn

    from radixlm.model.bf16_linear import Bf16Linear
    from radixlm.model.fused_ops import interleave_gated_mlps
    from radixlm.model.lora.adapters import LoRAAdapters

    torch.manual_seed(4)
    gate, up, down = (nn.Linear(k, n, bias=False, dtype=torch.bfloat16) for k, n in ((64, 96), (64, 96), (96, 64)))
    mlp = FusedGatedMLP(gate, up, down, cpp_kernels=True)
    mlp.gate_up_proj, mlp.down_proj = Bf16Linear(mlp.gate_up_proj), Bf16Linear(mlp.down_proj)
    plain_weight = mlp.gate_up_proj.weight.clone()
    holder = nn.Sequential(mlp)
    assert interleave_gated_mlps(holder) == 1 and interleave_gated_mlps(holder) == 0  # once
    assert not torch.equal(mlp.gate_up_proj.weight, plain_weight)

    def reference(x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(x.float() @ gate.weight.float().t()) * (x.float() @ up.weight.float().t())
        return hidden.bfloat16().float() @ down.weight.float().t()

    limit = mlp.gate_up_proj.row_limit
    gated_rows: list[int] = []
    forward_gated = mlp.gate_up_proj.forward_gated
    mlp.gate_up_proj.forward_gated = lambda x: gated_rows.append(x.shape[-2]) or forward_gated(x)
    for rows in (1, 33, limit, limit + 1, 700):
        x = torch.randn(1, rows, 64).bfloat16()
        with torch.inference_mode():
            got = mlp(x).float()
        torch.testing.assert_close(got, reference(x), rtol=2 ** -6, atol=2e-2)
    assert gated_rows == [1, 33, limit, limit + 1, 700]  # prefill-sized calls too
    del mlp.gate_up_proj.forward_gated
    with torch.inference_mode():  # float32 rows: the projection (in bfloat16), then the blocks' silu
        torch.testing.assert_close(mlp(x.float()).float(), reference(x), rtol=2 ** -6, atol=2e-2)
    with torch.enable_grad():
        got = mlp(x).float()
    torch.testing.assert_close(got, reference(x), rtol=2 ** -6, atol=2e-2)
    LoRAAdapters(holder)  # its gate and up deltas are laid out by halves
    assert torch.equal(mlp.gate_up_proj.weight, plain_weight) and not mlp._gated
