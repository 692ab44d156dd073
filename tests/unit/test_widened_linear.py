"""Bfloat16 linears widened to float32 by blocks compute the reference's float32 products and sums (one bfloat16
rounding of them), on every row count and block split; a bfloat16 model loads with them where oneDNN takes no
bfloat16, a tied LM head staying tied."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model import widened_linear as widened_module
from radixlm.model.attention import register_paged_attention
from radixlm.model.bf16_linear import reference_linear
from radixlm.model.loader import load_model
from radixlm.model.prepacked_linear import prepacking_available
from radixlm.model.widened_linear import MIN_ROWS, WidenedLinear, use_widened_linears, widened_linear


def assert_one_rounding_apart(got: torch.Tensor, want: torch.Tensor) -> None:
    """Both are float32 sums of the same exact products in different orders, rounded to bfloat16 once."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("out_features", "in_features"), [(96, 64), (300, 100), (600, 576)])
def test_the_widened_product_is_the_reference_one(bias, out_features, in_features, monkeypatch):
    """Output sizes below, across and at several blocks (a block of 128 here), the bias added in float32."""
    monkeypatch.setattr(widened_module, "BLOCK", 128)
    torch.manual_seed(0)
    weight = torch.randn(out_features, in_features).bfloat16()
    bias_tensor = torch.randn(out_features).bfloat16() if bias else None
    for shape in ((4, in_features), (2, 33, in_features), (257, in_features)):
        x = torch.randn(shape).bfloat16()
        got = widened_linear(x, weight, bias_tensor)
        assert_one_rounding_apart(got, reference_linear(x, weight, bias_tensor))


def test_a_decode_steps_few_rows_keep_f_linear_and_more_are_widened():
    torch.manual_seed(1)
    linear = nn.Linear(64, 48, dtype=torch.bfloat16)
    module = WidenedLinear(linear)
    assert module.weight is linear.weight and module.bias is linear.bias
    with torch.inference_mode():
        for rows in range(1, MIN_ROWS):
            x = torch.randn(rows, 64, dtype=torch.bfloat16)
            assert torch.equal(module(x), F.linear(x, linear.weight, linear.bias)), rows
        for rows in (MIN_ROWS, 40):
            x = torch.randn(1, rows, 64, dtype=torch.bfloat16)
            assert torch.equal(module(x), widened_linear(x, linear.weight, linear.bias)), rows
        float_rows = torch.randn(8, 64)
        assert module(float_rows).dtype == torch.bfloat16  # float32 inputs are rounded first, as F.linear needs
    with pytest.raises(ValueError, match="bfloat16 CPU weight"):
        WidenedLinear(nn.Linear(4, 4))


def test_every_bfloat16_linear_is_replaced_and_a_tied_head_stays_tied():
    embedding = nn.Embedding(50, 32, dtype=torch.bfloat16)
    head = nn.Linear(32, 50, bias=False, dtype=torch.bfloat16)
    head.weight = embedding.weight
    model = nn.ModuleDict({"embed": embedding, "up": nn.Linear(32, 64, dtype=torch.bfloat16),
                           "down": nn.Linear(64, 32), "head": head})
    hooked = nn.Linear(32, 32, dtype=torch.bfloat16)
    hooked.register_forward_hook(lambda module, args, output: output)
    model["hooked"] = hooked
    assert use_widened_linears(model) == 2
    assert model["hooked"] is hooked  # its hook (a tensor-parallel sum, say) stays where it runs
    assert isinstance(model["up"], WidenedLinear) and isinstance(model["head"], WidenedLinear)
    assert type(model["down"]) is nn.Linear  # float32: left alone
    assert model["head"].weight is model["embed"].weight


@pytest.mark.skipif(prepacking_available(), reason="oneDNN takes bfloat16 on this CPU: the prepacked linears serve")
def test_a_bfloat16_model_loads_widened_where_onednn_takes_no_bfloat16(tiny_model_dir):
    attention = register_paged_attention()
    fast = load_model(tiny_model_dir("llama"), torch.bfloat16, attention, small_batch_kernels=True)
    plain = load_model(tiny_model_dir("llama"), torch.bfloat16, attention, small_batch_kernels=False)
    widened = {name: m for name, m in fast.named_modules() if isinstance(m, WidenedLinear)}
    assert widened and not any(isinstance(m, WidenedLinear) for m in plain.modules())
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, module in widened.items():
            x = torch.randn(1, 9, module.in_features, dtype=torch.bfloat16)
            assert_one_rounding_apart(module(x), plain.get_submodule(name)(x))
