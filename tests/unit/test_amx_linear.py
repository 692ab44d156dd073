"""The AMX-BF16 linear (csrc/linear/amx_bf16.cpp) against its PyTorch reference on every row count, the packed
layout against `pack`/`unpack`, a tied head and its embedding sharing one packed copy, and the choice between the
AMX and oneDNN paths (each forced)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.amx_linear import (
    AmxLinear,
    PackedEmbedding,
    amx_available,
    fits,
    pack,
    pack_parameter,
    reference_linear,
    unpack,
)
from radixlm.model.prepacked_linear import PrepackedLinear, prepacking_available, use_prepacked_linears

needs_amx = pytest.mark.skipif(not amx_available(), reason="this CPU has no AMX-BF16 (or radixlm._C is not built)")


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to one bfloat16 rounding step: the kernel sums in another order than PyTorch's float32 matmul."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)


def test_pack_and_unpack_are_inverse_and_lay_out_groups_of_32():
    weight = torch.arange(64 * 96, dtype=torch.float32).reshape(64, 96).to(torch.bfloat16)
    packed = pack(weight)
    assert packed.shape == (2, 48, 32, 2) and packed.is_contiguous()
    assert torch.equal(unpack(packed), weight)
    assert torch.equal(packed[1, 5, 7], weight[32 + 7, 10:12])  # group 1, input pair 5, output 7
    assert fits(64, 96) and not fits(48, 96) and not fits(64, 80) and not fits(0, 32)
    with pytest.raises(ValueError, match="multiples of 32"):
        pack(torch.zeros(40, 64))


@needs_amx
@pytest.mark.parametrize("bias", [None, torch.float32, torch.bfloat16])
def test_kernel_matches_the_reference_at_every_row_count(bias):
    torch.manual_seed(0)
    weight = torch.randn(160, 96).to(torch.bfloat16)
    bias_values = None if bias is None else torch.randn(160).to(bias)
    layer = AmxLinear(pack_parameter(weight), bias_values)
    for rows in (1, 3, 15, 16, 17, 31, 32, 33, 64, 100):
        x = torch.randn(rows, 96).to(torch.bfloat16)
        assert_bf16_close(layer(x), reference_linear(x, layer.packed, bias_values))
    x = torch.randn(2, 3, 96).to(torch.bfloat16)
    assert layer(x).shape == (2, 3, 160)
    assert layer(torch.zeros(0, 96, dtype=torch.bfloat16)).shape == (0, 160)


@needs_amx
def test_kernel_rejects_what_it_cannot_read():
    layer = AmxLinear(pack_parameter(torch.zeros(32, 64, dtype=torch.bfloat16)), None)
    with pytest.raises(RuntimeError, match="features"):
        layer(torch.zeros(2, 32, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        layer._kernel(torch.zeros(2, 64), layer.packed, None)
    with pytest.raises(RuntimeError, match="bias"):
        layer._kernel(torch.zeros(2, 64, dtype=torch.bfloat16), layer.packed, torch.zeros(5))
    with pytest.raises(RuntimeError, match="packed"):
        layer._kernel(torch.zeros(2, 64, dtype=torch.bfloat16), layer.packed.view(1, 32, 64, 1), None)


def test_packed_embedding_reads_the_rows_of_the_plain_weight():
    weight = torch.randn(96, 64).to(torch.bfloat16)
    embedding = PackedEmbedding(pack_parameter(weight))
    ids = torch.tensor([[0, 31, 32, 95], [7, 7, 64, 1]])
    assert torch.equal(embedding(ids), F.embedding(ids, weight))


class TiedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(96, 64, dtype=torch.bfloat16)
        self.body = nn.Linear(64, 64, dtype=torch.bfloat16)
        self.head = nn.Linear(64, 96, bias=False, dtype=torch.bfloat16)
        self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def set_input_embeddings(self, module: nn.Module) -> None:
        self.embed = module

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def set_output_embeddings(self, module: nn.Module) -> None:
        self.head = module

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


@needs_amx
def test_forcing_amx_packs_every_fitting_linear_and_a_tied_head_once():
    torch.manual_seed(0)
    model = TiedModel()
    ids = torch.tensor([3, 50, 95])
    with torch.inference_mode():
        want = model(ids)
        assert use_prepacked_linears(model, amx=True) == 2
        assert isinstance(model.body, AmxLinear) and isinstance(model.head, AmxLinear)
        assert isinstance(model.embed, PackedEmbedding) and model.embed.packed is model.head.packed
        assert_bf16_close(model(ids), want)


@pytest.mark.skipif(not prepacking_available(), reason="PyTorch is built without oneDNN")
def test_forcing_onednn_leaves_the_tied_head_to_f_linear():
    model = TiedModel()
    assert use_prepacked_linears(model, amx=False) == 1
    assert isinstance(model.body, PrepackedLinear) and type(model.head) is nn.Linear
    assert type(model.embed) is nn.Embedding


@needs_amx
def test_a_shape_that_does_not_fit_keeps_onednn():
    model = nn.Sequential(nn.Linear(64, 48, dtype=torch.bfloat16), nn.Linear(48, 64, dtype=torch.bfloat16),
                          nn.Linear(64, 64, dtype=torch.bfloat16))
    assert use_prepacked_linears(model, amx=True) == 3
    assert [type(m) for m in model] == [PrepackedLinear, PrepackedLinear, AmxLinear]
