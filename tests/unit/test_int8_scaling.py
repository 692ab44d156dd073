"""Int8Linear's per-token scaling around fbgemm in C++ (csrc/int8_scaling.cpp) against the PyTorch ops it replaces:
bit-identical, extreme rows included."""

import math

import pytest
import torch
from torch import nn

from radixlm.model.ops import direct_kernel, extension_error
from radixlm.model.quantize import Int8Linear
from radixlm.model.small_batch import INT8_MAX_ROWS

pytestmark = pytest.mark.skipif(extension_error() is not None,
                                reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")


def _pair(in_features: int, out_features: int, bias: bool) -> tuple[Int8Linear, Int8Linear]:
    torch.manual_seed(in_features * 7 + out_features)
    linear = nn.Linear(in_features, out_features, bias=bias)
    fused = Int8Linear.from_linear(linear, small_batch=False, fused_scaling=True)
    reference = Int8Linear.from_linear(linear, small_batch=False, fused_scaling=False)
    return fused, reference


def _assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal bit for bit, NaNs included."""
    assert a.shape == b.shape
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize(("in_features", "out_features"), [(576, 1536), (1536, 576), (70, 37), (2, 5), (17, 300)])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_scaling_is_bit_identical_to_the_torch_ops(in_features, out_features, bias):
    fused, reference = _pair(in_features, out_features, bias)
    with torch.inference_mode():
        for num_rows in (0, 1, 3, INT8_MAX_ROWS + 1, 300):
            for magnitude in (1e-30, 1e-3, 1.0, 1e3, 1e30):
                x = torch.randn(num_rows, in_features) * magnitude
                _assert_same(fused(x), reference(x))
        x = torch.randn(2, 5, in_features)  # 3-D input
        _assert_same(fused(x), reference(x))


def test_extreme_rows_match_the_torch_ops():
    fused, reference = _pair(48, 33, True)
    x = torch.randn(8, 48)
    x[1] = 0.0  # all zeros: divided by the smallest normal float, not by zero
    x[2, 5] = math.nan  # NaN anywhere: the row's maximum is NaN, as torch.amax gives
    x[3, 47] = math.inf
    x[4, 0] = -math.inf
    x[5] = 1e-45  # subnormal
    x[6, 20] = -0.0
    x[7] = torch.finfo(torch.float32).max
    with torch.inference_mode():
        _assert_same(fused(x), reference(x))
        assert torch.isnan(fused(x)[2]).all()


def test_the_direct_calls_equal_the_ops_and_check_their_arguments():
    normalize, rescale = direct_kernel("int8_normalize_rows"), direct_kernel("int8_rescale_rows_")
    x = torch.randn(5, 40)
    row_max, op_row_max = torch.empty(5), torch.empty(5)
    normalized = normalize(x, row_max)
    assert torch.equal(normalized, torch.ops.radixlm.int8_normalize_rows(x, op_row_max))
    assert torch.equal(row_max, op_row_max) and torch.equal(row_max, x.abs().amax(dim=1))
    assert torch.equal(normalized[-1, [0, -1]], torch.tensor([1.0, -1.0])) and not normalized[-1, 1:-1].any()
    out, bias = torch.randn(6, 9), torch.randn(9)
    direct, op = out.clone(), out.clone()
    assert rescale(direct, row_max, bias) is direct
    torch.ops.radixlm.int8_rescale_rows_(op, row_max, bias)
    assert torch.equal(direct, op) and torch.equal(direct[-1], out[-1])  # the range row's output is left alone
    assert torch.equal(rescale(out.clone(), row_max, None)[:-1], out[:-1] * row_max[:, None])
    with pytest.raises(RuntimeError, match="row_max"):
        normalize(x, torch.empty(4))
    with pytest.raises(RuntimeError, match="K >= 2"):
        normalize(torch.randn(3, 1), torch.empty(3))
    with pytest.raises(RuntimeError, match="float32"):
        normalize(x.double(), row_max)
    with pytest.raises(RuntimeError, match="bias"):
        rescale(out, row_max, torch.randn(8))
    with pytest.raises(RuntimeError, match="M \\+ 1"):
        rescale(torch.randn(9), row_max, None)
    with pytest.raises(RuntimeError, match="contiguous"):
        rescale(torch.randn(9, 6).t(), row_max, None)
    with pytest.raises(TypeError, match="2 arguments"):
        normalize(x)


def test_a_nan_row_gives_nan_on_either_side_of_the_kernel_limit():
    torch.manual_seed(1)
    linear = nn.Linear(48, 33)
    kernel = Int8Linear.from_linear(linear, small_batch=True)
    if kernel._small_batch is None:
        pytest.skip("the int8 kernel is not built or not vectorised here")
    reference = Int8Linear.from_linear(linear, small_batch=False, fused_scaling=False)
    x = torch.randn(3, 48)
    x[1, 7] = math.nan
    with torch.inference_mode():
        _assert_same(kernel(x), reference(x))  # the kernel's rows
        assert torch.isnan(kernel(x)[1]).all() and torch.isfinite(kernel(x)[[0, 2]]).all()
