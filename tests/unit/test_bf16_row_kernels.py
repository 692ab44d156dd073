"""radixlm._C's bfloat16 row kernels (csrc/norm, csrc/activation) against float32 references on the same inputs:
each output is the float32 result rounded once to bfloat16, so it is within a bfloat16 rounding of it (PyTorch's own
bfloat16 ops round after every step and land further off)."""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from radixlm.model.fused_ops import FusedGatedMLP, FusedRMSNorm, fuse_small_ops
from radixlm.model.ops import extension, extension_error

pytestmark = pytest.mark.skipif(extension_error() is not None, reason="radixlm._C is not built")
BF16_STEP = 2.0 ** -8  # a bfloat16 value is within this relative distance of the float32 it was rounded from


def assert_rounded_once(actual: torch.Tensor, reference: torch.Tensor, atol: float = 1e-30) -> None:
    assert actual.dtype == torch.bfloat16 and actual.shape == reference.shape
    torch.testing.assert_close(actual.float(), reference, rtol=BF16_STEP, atol=atol, equal_nan=True)


@pytest.mark.parametrize("features", [576, 17, 5])
def test_bf16_norm_is_float32_rms_norm_rounded_once(features):
    kernels = extension()
    torch.manual_seed(features)
    weight = (torch.randn(features) * 2).bfloat16()
    for rows in (1, 7, 300):
        x = (torch.randn(2, rows, features) * 3).bfloat16()
        reference = F.rms_norm(x.float(), (features,), weight.float(), 1e-5)
        assert_rounded_once(kernels.rms_norm(x, weight, 1e-5), reference)
        assert_rounded_once(torch.ops.radixlm.rms_norm(x, weight, 1e-5), reference)
        strided = x.transpose(0, 1)  # a view: computed on a contiguous copy
        assert_rounded_once(kernels.rms_norm(strided, weight, 1e-5), reference.transpose(0, 1).contiguous())


def test_fused_bf16_norm_and_mlp_take_the_kernels():
    norm = LlamaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_()
    holder = torch.nn.Sequential(norm)
    assert fuse_small_ops(holder, cpp_kernels=True) == 1
    fused = holder[0]
    assert isinstance(fused, FusedRMSNorm) and fused._kernel is not None
    x = torch.randn(3, 64).bfloat16()
    with torch.no_grad():
        assert_rounded_once(fused(x), F.rms_norm(x.float(), (64,), norm.weight.float(), 1e-6))
    linears = [torch.nn.Linear(*shape, bias=False).to(torch.bfloat16) for shape in ((64, 96), (64, 96), (96, 64))]
    mlp = FusedGatedMLP(*linears, cpp_kernels=True)
    assert mlp._activation is not None
    with torch.no_grad():
        gate, up = linears[0](x).float(), linears[1](x).float()
        expected = linears[2]((F.silu(gate) * up).bfloat16()).float()
        torch.testing.assert_close(mlp(x).float(), expected, rtol=0.05, atol=0.05)
    assert FusedGatedMLP(*linears)._activation is None  # without cpp_kernels: PyTorch's ops


@pytest.mark.parametrize("head_dim", [64, 8, 2])
def test_bf16_rotary_is_float32_rotary_rounded_once(head_dim):
    kernels = extension()
    torch.manual_seed(head_dim)
    for tokens in (1, 7, 300):
        qkv = (torch.randn(1, tokens, 15 * head_dim) * 3).bfloat16().view(1, tokens, 15, head_dim).transpose(1, 2)
        query_key = qkv[:, :12]  # the strided view of a fused projection's output
        angles = torch.randn(1, tokens, head_dim // 2) * 50
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
        expected, _ = apply_rotary_pos_emb(query_key.float(), query_key.float(), cos.float(), sin.float())
        actual = kernels.rotary(query_key, cos, sin)
        # A sum of two products can cancel: allow float32's rounding of the products, then one bfloat16 rounding.
        assert_rounded_once(actual, expected, atol=1e-5)
        assert torch.equal(torch.ops.radixlm.rotary(query_key, cos, sin), actual)


def test_bf16_silu_and_mul_is_float32_rounded_once():
    kernels = extension()
    torch.manual_seed(0)
    for rows, features in ((1, 1536), (33, 1536), (4, 40), (2, 7)):
        gate_up = (torch.randn(1, rows, 2 * features) * 8).bfloat16()
        gate, up = gate_up[..., :features].float(), gate_up[..., features:].float()
        expected = F.silu(gate) * up
        assert_rounded_once(kernels.silu_and_mul(gate_up), expected, atol=1e-30)
        assert torch.equal(torch.ops.radixlm.silu_and_mul(gate_up), kernels.silu_and_mul(gate_up))
    edges = torch.tensor([float("nan"), float("inf"), 0.0, -0.0, 1e-38, 100.0, -100.0, 87.0, -87.0, 3.0,
                          -3.0, 0.5, -0.5, 20.0, -20.0, 1.0], dtype=torch.bfloat16)
    out = kernels.silu_and_mul(torch.cat([edges, torch.full_like(edges, 2.0)]))
    expected = F.silu(edges.float()) * 2.0
    assert torch.isnan(out[0]) and out[1] == float("inf")
    # Past |x| = 87 exp is clamped: silu(-100) is about -4e-42 in float32 and about -2e-36 here; both round to
    # zero in any computation that follows.
    assert_rounded_once(out[2:], expected[2:], atol=1e-35)


def test_bf16_kernels_refuse_bad_arguments():
    kernels = extension()
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernels.silu_and_mul(torch.randn(2, 8))
    with pytest.raises(RuntimeError, match=r"\[\.\.\., 2I\]"):
        kernels.silu_and_mul(torch.randn(2, 7).bfloat16())
    with pytest.raises(RuntimeError, match="dense CPU tensor"):
        kernels.silu_and_mul(torch.randn(2, 8, device="meta").bfloat16())
    with pytest.raises(TypeError, match="1 argument"):
        kernels.silu_and_mul()
    with pytest.raises(RuntimeError, match="weight must be bfloat16"):
        kernels.rms_norm(torch.randn(2, 16).bfloat16(), torch.randn(16), 1e-6)
    with pytest.raises(RuntimeError, match="cos and sin must be bfloat16"):
        kernels.rotary(torch.randn(1, 3, 4, 8).bfloat16(), torch.randn(1, 4, 8), torch.randn(1, 4, 8))
    assert kernels.silu_and_mul(torch.empty(0, 8).bfloat16()).shape == (0, 4)
    assert kernels.rms_norm(torch.empty(0, 16).bfloat16(), torch.ones(16).bfloat16(), 1e-6).shape == (0, 16)
