"""Bfloat16 linears prepacked for oneDNN compute what `F.linear` computes, on every row count, without reordering
their weight on each call; a bfloat16 model loads with them unless the all-PyTorch reference is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.attention import register_paged_attention
from radixlm.model.bf16_linear import Bf16Linear, DotPackedLinear
from radixlm.model.fused_ops import FusedGatedMLP
from radixlm.model.loader import load_model
from radixlm.model.prepacked_linear import PrepackedLinear, prepacking_available, use_prepacked_linears

pytestmark = pytest.mark.skipif(not prepacking_available(), reason="PyTorch is built without oneDNN")


@pytest.mark.parametrize("bias", [False, True])
def test_outputs_equal_f_linear_at_every_row_count(bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=bias, dtype=torch.bfloat16)
    packed = PrepackedLinear(linear)
    with torch.inference_mode():
        for rows in (1, 3, 9, 32, 257):
            x = torch.randn(1, rows, 96, dtype=torch.bfloat16)
            assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias)), rows


def test_float32_and_tied_heads_are_left_alone():
    model = nn.Sequential(nn.Linear(8, 8, dtype=torch.float32), nn.Linear(8, 8, dtype=torch.bfloat16))
    assert use_prepacked_linears(model, None) == 1
    assert type(model[0]) is nn.Linear and isinstance(model[1], PrepackedLinear)
    with pytest.raises(ValueError, match="bfloat16 CPU weight"):
        PrepackedLinear(nn.Linear(4, 4))


def test_a_bfloat16_model_loads_prepacked_and_computes_the_same(tiny_model_dir):
    """The C++ kernels' switch (off: the all-PyTorch reference) decides; each linear computes what the plain one
    does (oneDNN's exactly, our kernels' up to their summation order: one bfloat16 rounding step)."""
    attention = register_paged_attention()
    fast = load_model(tiny_model_dir("llama"), torch.bfloat16, attention, small_batch_kernels=True)
    plain = load_model(tiny_model_dir("llama"), torch.bfloat16, attention, small_batch_kernels=False)
    packed_types = (PrepackedLinear, Bf16Linear, DotPackedLinear)
    assert any(isinstance(m, packed_types) for m in fast.modules())
    assert not any(isinstance(m, packed_types) for m in plain.modules())
    for module in fast.modules():  # the gate/up weights back in the plain order (see `interleave_halves`)
        if isinstance(module, FusedGatedMLP):
            module.restore_halves()
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, module in fast.named_modules():
            if isinstance(module, packed_types):
                x = torch.randn(1, 5, module.in_features, dtype=torch.bfloat16)
                got, want = module(x), plain.get_submodule(name)(x)
                if isinstance(module, PrepackedLinear):
                    assert torch.equal(got, want), name
                else:
                    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)


def test_no_weight_reorder_per_call():
    """ONEDNN_VERBOSE lists every primitive oneDNN runs: after the prepacking, calls run matmuls and no reorder."""
    script = textwrap.dedent("""
        import torch
        from torch import nn
        from radixlm.model.prepacked_linear import PrepackedLinear
        packed = PrepackedLinear(nn.Linear(256, 512, dtype=torch.bfloat16))
        x = torch.randn(16, 256, dtype=torch.bfloat16)
        packed(x)
        print("--- calls ---", flush=True)
        for _ in range(3):
            packed(x)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "ONEDNN_VERBOSE": "1"}, check=True)
    calls = result.stdout.split("--- calls ---", 1)[1]
    executed = [line for line in calls.splitlines() if line.startswith("onednn_verbose") and ",exec," in line]
    assert executed, result.stdout[-2000:]
    assert not [line for line in executed if ",reorder," in line], executed
