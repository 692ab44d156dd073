"""The bfloat16 row kernels (AMX-BF16, csrc/linear/amx_bf16.cpp; AVX-512 BF16 dot products, csrc/linear/bf16_dot.cpp)
against their PyTorch reference on every row count, `Bf16Linear`'s split between a kernel and `F.linear`, a tied head
keeping its one weight, and the choice between the row kernels and oneDNN (each forced)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.bf16_linear import (
    AMX,
    AMX_MIN_ROWS,
    DOT,
    PACKED,
    Bf16Linear,
    DotPackedLinear,
    amx_available,
    amx_row_limit,
    dot_available,
    fits,
    pack_weight,
    reference_linear,
    row_limit,
)
from radixlm.model.huge_pages import HUGE_PAGE_BYTES, HugePageArena
from radixlm.model.prepacked_linear import PrepackedLinear, prepacking_available, use_prepacked_linears

needs_amx = pytest.mark.skipif(not amx_available(), reason="this CPU has no AMX-BF16 (or radixlm._C is not built)")
KERNELS = [pytest.param(AMX, marks=needs_amx),
           pytest.param(DOT, marks=pytest.mark.skipif(not dot_available(), reason="this CPU has no AVX-512 BF16"))]


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to one bfloat16 rounding step: the kernel sums in another order than PyTorch's float32 matmul."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)


def test_row_limit_keeps_x_in_cache_between_bounds():
    assert amx_row_limit(576) == 320 and amx_row_limit(1536) == 320 and amx_row_limit(2048) == 256
    assert amx_row_limit(4096) == amx_row_limit(8192) == AMX_MIN_ROWS


def test_shapes_the_kernel_takes():
    assert fits(64, 96) and not fits(48, 96) and not fits(64, 80) and not fits(0, 32)
    assert fits(48, 96, DOT) and not fits(64, 80, DOT) and not fits(0, 32, DOT)
    assert row_limit(DOT, 576) == 32 and row_limit(AMX, 576) == amx_row_limit(576)
    with pytest.raises(ValueError, match="kernel"):
        Bf16Linear(nn.Linear(64, 64, dtype=torch.bfloat16), "vnni")
    with pytest.raises(ValueError, match="multiples of 32"):
        Bf16Linear(nn.Linear(64, 40, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16"):
        Bf16Linear(nn.Linear(64, 64))


@pytest.mark.parametrize("kernel_name", KERNELS)
@pytest.mark.parametrize("bias", [None, torch.float32, torch.bfloat16])
def test_kernel_matches_the_reference_at_every_row_count(bias, kernel_name):
    torch.manual_seed(0)
    weight = torch.randn(160, 96).to(torch.bfloat16)
    bias_values = None if bias is None else torch.randn(160).to(bias)
    kernel = Bf16Linear(nn.Linear(96, 160, dtype=torch.bfloat16), kernel_name)._kernel
    for rows in (1, 3, 15, 16, 17, 31, 32, 33, 48, 64, 100, 300, 321, 700):  # above 320: the AMX kernel's chunks
        x = torch.randn(rows, 96).to(torch.bfloat16)
        assert_bf16_close(kernel(x, weight, bias_values), reference_linear(x, weight, bias_values))
    assert kernel(torch.zeros(2, 3, 96, dtype=torch.bfloat16), weight, None).shape == (2, 3, 160)
    assert kernel(torch.zeros(0, 96, dtype=torch.bfloat16), weight, None).shape == (0, 160)


@pytest.mark.parametrize("kernel_name", KERNELS)
def test_kernel_rejects_what_it_cannot_read(kernel_name):
    kernel = Bf16Linear(nn.Linear(64, 32, dtype=torch.bfloat16), kernel_name)._kernel
    weight, x = torch.zeros(32, 64, dtype=torch.bfloat16), torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="features"):
        kernel(torch.zeros(2, 32, dtype=torch.bfloat16), weight, None)
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernel(x.float(), weight, None)
    with pytest.raises(RuntimeError, match="bias"):
        kernel(x, weight, torch.zeros(5))
    with pytest.raises(RuntimeError, match="contiguous"):
        kernel(x, torch.zeros(64, 32, dtype=torch.bfloat16).t(), None)
    with pytest.raises(RuntimeError, match="multiple"):
        kernel(torch.zeros(2, 40, dtype=torch.bfloat16), torch.zeros(32, 40, dtype=torch.bfloat16), None)


@pytest.mark.parametrize("kernel_name", KERNELS)
def test_few_rows_take_the_kernel_and_many_take_f_linear(monkeypatch, kernel_name):
    torch.manual_seed(0)
    layer = Bf16Linear(nn.Linear(64, 96, dtype=torch.bfloat16), kernel_name)
    calls = []
    kernel = layer._kernel
    monkeypatch.setattr(layer, "_kernel", lambda *args: calls.append(args[0].shape) or kernel(*args))
    limit = row_limit(kernel_name, 64)
    few, many = torch.randn(2, limit // 2, 64), torch.randn(1, limit + 1, 64)
    assert_bf16_close(layer(few), reference_linear(few.bfloat16(), layer.weight, layer.bias))  # float32 x: cast
    assert torch.equal(layer(many), F.linear(many.bfloat16(), layer.weight, layer.bias))
    assert calls == [few.shape]


def reference_linear_add(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         residual: torch.Tensor) -> torch.Tensor:
    """`residual + x W^T (+ b)` in float32, rounded to bfloat16 once."""
    float_bias = None if bias is None else bias.float()
    return (F.linear(x.float(), weight.float(), float_bias) + residual.float()).to(torch.bfloat16)


@needs_amx
@pytest.mark.parametrize("bias", [None, torch.bfloat16])
def test_kernel_adds_the_residual_in_its_writes(bias):
    torch.manual_seed(1)
    weight = torch.randn(160, 96).to(torch.bfloat16)
    bias_values = None if bias is None else torch.randn(160).to(bias)
    kernel_add = Bf16Linear(nn.Linear(96, 160, dtype=torch.bfloat16))._kernel_add
    for rows in (1, 15, 16, 17, 32, 33, 100, 333):  # 333: two chunks, each adding its own rows' residual
        x, residual = torch.randn(1, rows, 96).bfloat16(), (torch.randn(1, rows, 160) * 4).bfloat16()
        assert_bf16_close(kernel_add(x, weight, residual, bias_values),
                          reference_linear_add(x, weight, bias_values, residual))
    assert torch.ops.radixlm.amx_bf16_linear(x, weight, bias_values, residual).equal(
        kernel_add(x, weight, residual, bias_values))
    with pytest.raises(RuntimeError, match="residual"):
        kernel_add(x, weight, residual[:, :-1], None)
    with pytest.raises(RuntimeError, match="residual"):
        kernel_add(x, weight, residual.float(), None)


def interleave_by_16(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows 32g..32g+15 gate's rows 16g..16g+15, rows 32g+16..32g+31 up's same rows."""
    half, width = gate.shape
    return torch.stack([gate.view(half // 16, 16, width), up.view(half // 16, 16, width)], 1).reshape(-1, width)


@needs_amx
def test_gated_kernel_is_silu_of_gate_times_up_rounded_once():
    torch.manual_seed(3)
    gate, up = torch.randn(96, 64).bfloat16(), torch.randn(96, 64).bfloat16()
    weight = interleave_by_16(gate, up).contiguous()
    layer = Bf16Linear(nn.Linear(64, 192, bias=False, dtype=torch.bfloat16))
    for rows in (1, 15, 16, 17, 32, 33, 100, 513):  # 513: two chunks of rows
        x = torch.randn(1, rows, 64).bfloat16()
        reference = (F.silu(x.float() @ gate.float().t()) * (x.float() @ up.float().t())).bfloat16()
        assert_bf16_close(layer._kernel_gated(x, weight), reference)
    assert torch.ops.radixlm.amx_bf16_gated_linear(x, weight).equal(layer._kernel_gated(x, weight))
    edges = torch.zeros(2, 64).bfloat16()
    edges[0, 0], edges[1, 0] = float("nan"), float("inf")
    extreme = torch.zeros(192, 64).bfloat16()
    extreme[:, 0] = 1.0
    out = layer._kernel_gated(edges, extreme)
    assert out[0].isnan().all() and out[1].isinf().all()


@pytest.mark.parametrize("kernel_name", KERNELS)
def test_forward_add_is_the_sum_on_every_path(kernel_name):
    """The kernel's rows, `torch.addmm`'s above the row limit, a bias, float32 rows: each `residual + forward(x)`
    within a bfloat16 rounding (one rounding fewer)."""
    torch.manual_seed(2)
    for bias in (False, True):
        layer = Bf16Linear(nn.Linear(64, 96, bias=bias, dtype=torch.bfloat16), kernel_name)
        limit = row_limit(kernel_name, 64)
        for rows in (1, 7, limit, limit + 1, 2 * limit):
            x, residual = torch.randn(1, rows, 64).bfloat16(), (torch.randn(1, rows, 96) * 4).bfloat16()
            got = layer.forward_add(x, residual)
            assert got.dtype == torch.bfloat16 and got.shape == residual.shape
            # Within a bfloat16 step of the terms' sizes: where the two terms cancel, the paths that round the
            # linear's output before adding (a bias, the DOT kernel) are off by a step of the terms, not the sum.
            linear = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
            error = (got.float() - reference_linear_add(x, layer.weight, layer.bias, residual).float()).abs()
            assert bool((error <= 2 ** -7 * (linear.abs() + residual.float().abs()) + 1e-6).all())
    x32 = torch.randn(3, 64)
    residual32 = torch.randn(3, 96)
    assert torch.equal(layer.forward_add(x32, residual32), residual32 + layer(x32))


class TiedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(96, 64, dtype=torch.bfloat16)
        self.body = nn.Linear(64, 64, dtype=torch.bfloat16)
        self.head = nn.Linear(64, 96, bias=False, dtype=torch.bfloat16)
        self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


@pytest.mark.parametrize("kernel_name", KERNELS)
def test_forcing_a_kernel_takes_every_fitting_linear_and_a_tied_head_keeps_its_weight(kernel_name):
    torch.manual_seed(0)
    model = TiedModel()
    ids = torch.tensor([3, 50, 95])
    with torch.inference_mode():
        want = model(ids)
        assert use_prepacked_linears(model, kernel_name) == 2
        assert isinstance(model.body, Bf16Linear) and isinstance(model.head, Bf16Linear)
        assert model.head.kernel == kernel_name
        assert model.head.weight is model.embed.weight
        assert_bf16_close(model(ids), want)


@pytest.mark.skipif(not prepacking_available(), reason="PyTorch is built without oneDNN")
def test_forcing_onednn_leaves_the_tied_head_to_f_linear():
    model = TiedModel()
    assert use_prepacked_linears(model, None) == 1
    assert isinstance(model.body, PrepackedLinear) and type(model.head) is nn.Linear


@needs_amx
def test_a_shape_that_does_not_fit_keeps_onednn():
    model = nn.Sequential(nn.Linear(64, 48, dtype=torch.bfloat16), nn.Linear(48, 64, dtype=torch.bfloat16),
                          nn.Linear(64, 64, dtype=torch.bfloat16))
    assert use_prepacked_linears(model, AMX) == 3
    assert [type(m) for m in model] == [PrepackedLinear, PrepackedLinear, Bf16Linear]


@pytest.mark.parametrize("op", ["amx_bf16_linear", "bf16_dot_linear", "bf16_packed_linear"])
def test_the_registered_op_has_a_fake_kernel_of_the_right_shape(op):
    """torch.compile traces the op through its fake kernel (radixlm.model.ops): the output is [..., N]."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, weight = torch.empty(3, 5, 64, dtype=torch.bfloat16), torch.empty(96, 64, dtype=torch.bfloat16)
        if op == "bf16_packed_linear":
            packed = torch.empty(3, 32, 32, dtype=torch.int32)
            assert torch.ops.radixlm.bf16_packed_linear(x, packed, 96, None).shape == (3, 5, 96)
        else:
            assert getattr(torch.ops.radixlm, op)(x, weight, None).shape == (3, 5, 96)


needs_avx512_bf16 = pytest.mark.skipif(not dot_available(), reason="this CPU has no AVX-512 BF16")


def test_pack_weight_layout():
    weight = torch.randn(40, 64).to(torch.bfloat16)
    packed = pack_weight(weight)
    assert packed.shape == (2, 32, 32) and packed.dtype == torch.int32
    words = packed.view(torch.int16)  # [2, 32, 64]: each word's low half first
    block, pair, feature = 1, 5, 3
    assert words[block, pair, 2 * feature].view(torch.bfloat16) == weight[32 + feature, 2 * pair]
    assert words[block, pair, 2 * feature + 1].view(torch.bfloat16) == weight[32 + feature, 2 * pair + 1]
    assert packed[1, :, 8:].eq(0).all()  # features 40 .. 63 do not exist


@needs_avx512_bf16
@pytest.mark.parametrize("bias", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features", [32, 100])
@pytest.mark.parametrize("in_features", [608, 512])  # over two chunks of 256 and a part; rows 1 KB apart: padded
def test_packed_kernel_matches_the_reference_at_every_row_count(bias, out_features, in_features):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, dtype=torch.bfloat16)
    if bias is None:
        linear.bias = None
    else:
        linear.bias = nn.Parameter(torch.randn(out_features).to(bias), requires_grad=False)
    layer = DotPackedLinear(linear)
    for rows in (1, 2, 5, 12, 13, 16, 25, 32, 64, 100, 300):
        x = torch.randn(rows, in_features).to(torch.bfloat16)
        assert_bf16_close(layer(x), reference_linear(x, linear.weight, linear.bias))
    strided = torch.randn(3, 2 * in_features).to(torch.bfloat16)[:, ::2]
    assert_bf16_close(layer(strided), reference_linear(strided, linear.weight, linear.bias))
    assert layer(torch.zeros(2, 3, in_features)).shape == (2, 3, out_features)
    assert layer(torch.zeros(0, in_features, dtype=torch.bfloat16)).shape == (0, out_features)


@needs_avx512_bf16
def test_packed_weight_placed_in_an_arena_computes_the_same():
    torch.manual_seed(0)
    linear = nn.Linear(512, 64, dtype=torch.bfloat16)
    arena = HugePageArena(chunk_bytes=HUGE_PAGE_BYTES)
    placed, plain = DotPackedLinear(linear, arena), DotPackedLinear(linear)
    assert arena.num_chunks == 1 and placed.packed.data_ptr() % HUGE_PAGE_BYTES == 0  # the arena's first tensor
    assert torch.equal(placed.packed, plain.packed)
    x = torch.randn(3, 512).to(torch.bfloat16)
    assert torch.equal(placed(x), plain(x))


@needs_avx512_bf16
def test_packed_kernel_rejects_a_packed_weight_of_another_shape():
    layer = DotPackedLinear(nn.Linear(64, 40, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="packed"):
        layer._kernel(torch.zeros(2, 64, dtype=torch.bfloat16), layer.packed, 70, None)
    with pytest.raises(RuntimeError, match="packed"):
        layer._kernel(torch.zeros(2, 32, dtype=torch.bfloat16), layer.packed, 40, None)
    with pytest.raises(RuntimeError, match="bias"):
        layer._kernel(torch.zeros(2, 64, dtype=torch.bfloat16), layer.packed, 40, torch.zeros(3))
    with pytest.raises(ValueError, match="multiple of 32"):
        DotPackedLinear(nn.Linear(40, 64, dtype=torch.bfloat16))


@needs_avx512_bf16
def test_packed_choice_gives_the_tied_head_the_plain_dot_kernel():
    torch.manual_seed(0)
    model = TiedModel()
    ids = torch.tensor([3, 50, 95])
    with torch.inference_mode():
        want = model(ids)
        assert use_prepacked_linears(model, PACKED) == 2
        assert isinstance(model.body, DotPackedLinear) and not hasattr(model.body, "weight")
        assert isinstance(model.head, Bf16Linear) and model.head.kernel == DOT
        assert model.head.weight is model.embed.weight
        assert_bf16_close(model(ids), want)
