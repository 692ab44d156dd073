"""LoRALinear adds each row group's adapter delta exactly as PEFT computes it, over float and int8 base projections;
LoRAConfig checks its flags."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radixlm.config import EngineConfig
from radixlm.model.gguf_linear import GGUFLinear
from radixlm.model.lora.linear import ActiveRows, DeltaPart, LoRALinear, ProjectionDelta, RowGroup
from radixlm.model.quantize import Int8Linear
from radixlm.model.serving_format import BLOCK_QUANTIZATIONS, quantize_to_blocks


def peft_delta(x, a, b, scaling):
    return (x @ a.T @ b.T) * scaling


def base_linear(kind: str, linear: nn.Linear) -> nn.Module:
    if kind == "int8":
        return Int8Linear(linear.weight, linear.bias, small_batch=False, fused_scaling=False)
    if kind == "q8_0":
        return GGUFLinear([quantize_to_blocks(linear.weight, BLOCK_QUANTIZATIONS["q8_0"], None)], linear.bias)
    return linear


@pytest.mark.parametrize("base_kind", ["float", "int8", "q8_0"])
def test_each_group_gets_its_adapters_delta_and_other_rows_none(base_kind):
    torch.manual_seed(0)
    base = base_linear(base_kind, nn.Linear(32, 12, bias=True))
    active = ActiveRows()
    lora = LoRALinear(base, active)
    a1, b1 = torch.randn(2, 32), torch.randn(5, 2)  # adapter 1 adapts columns 0..4 (say q of a fused q/k/v)
    a2, b2 = torch.randn(3, 32), torch.randn(12, 3)  # adapter 2 adapts every column
    lora.deltas[1] = ProjectionDelta(a1.T.contiguous(), (DeltaPart(0, 5, b1.T.contiguous(), 0.5),))
    lora.deltas[2] = ProjectionDelta(a2.T.contiguous(), (DeltaPart(0, 12, b2.T.contiguous(), 2.0),))
    x = torch.randn(1, 7, 32)
    with torch.inference_mode():
        plain = base(x)
        active.groups = (RowGroup(1, 1, 3), RowGroup(2, 3, 6))
        out = lora(x)
        active.groups = ()
    expected = plain.clone()
    expected[0, 1:3, 0:5] += peft_delta(x[0, 1:3], a1, b1, 0.5)
    expected[0, 3:6] += peft_delta(x[0, 3:6], a2, b2, 2.0)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-5)
    assert torch.equal(out[0, 0], plain[0, 0]) and torch.equal(out[0, 6], plain[0, 6])


def test_lora_config_flags():
    config = EngineConfig.from_kwargs(lora_modules=["a=/x", "b=/y"])
    assert config.lora.enabled and config.lora.modules == [("a", "/x"), ("b", "/y")]
    assert not EngineConfig.from_kwargs().lora.enabled
    for options, message in (({"lora_modules": ["a"]}, "name=path"), ({"lora_modules": ["a=/x", "a=/y"]}, "twice"),
                             ({"max_loras": 0}, "max_loras"), ({"max_lora_rank": 5000}, "max_lora_rank"),
                             ({"lora_modules": ["a=/x", "b=/y"], "max_loras": 1}, "more than max_loras"),
                             ({"enable_lora": True, "tensor_parallel_size": 2}, "tensor parallelism")):
        with pytest.raises(ValueError, match=message):
            EngineConfig.from_kwargs(**options)
