"""The C++ small-batch linears against PyTorch's kernels (the reference): float32 close (and each row the same
whatever the batch), int8 bit-identical."""

import pytest
import torch
from torch import nn

from radixlm.model.ops import direct_kernel, extension_error
from radixlm.model.quantize import Int8Linear
from radixlm.model.small_batch import (
    INT8_MAX_ROWS,
    MAX_ROWS,
    Int8Rows,
    SmallBatchLinear,
    float32_kernel_rows,
    int8_kernel_is_vectorized,
    use_small_batch_linears,
)

pytestmark = pytest.mark.skipif(extension_error() is not None,
                                reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")

# (in, out): multiples of the kernels' tiles and not; (1536, 1003) is split between threads and ends in a partial tile
SHAPES = [(576, 960), (1536, 576), (1536, 1003), (96, 80), (70, 37), (17, 5), (2, 300)]
# The int8 kernel at every row count where it is vectorized; elsewhere it is a plain loop (which serving leaves to
# fbgemm, and which took 54 of the suite's seconds on a Zen 3 at every count), so the counts where its code changes:
# 1 and 2 rows, pairs and a remainder, the last row quantized on the stack (17) and the first on the heap, the limit.
INT8_ROW_COUNTS = (range(1, INT8_MAX_ROWS + 1) if int8_kernel_is_vectorized()
                   else (1, 2, 3, 4, 5, 17, 18, INT8_MAX_ROWS - 1, INT8_MAX_ROWS))


@pytest.mark.parametrize(("in_features", "out_features"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_float32_kernel_matches_linear(in_features, out_features, bias):
    torch.manual_seed(in_features + out_features)
    linear = nn.Linear(in_features, out_features, bias=bias).requires_grad_(False)
    fast = SmallBatchLinear.from_linear(linear)
    assert fast.weight is linear.weight
    assert fast.max_rows == float32_kernel_rows() <= MAX_ROWS
    kernel = direct_kernel("small_batch_linear")
    for num_rows in range(1, MAX_ROWS + 2):
        x = torch.randn(num_rows, in_features)
        with torch.inference_mode():
            torch.testing.assert_close(fast(x), linear(x), atol=1e-5, rtol=1e-5)
            if num_rows <= MAX_ROWS:  # the kernel (every build): a row's sums do not depend on the rows beside it
                rows = kernel(x, linear.weight, linear.bias)
                torch.testing.assert_close(rows, linear(x), atol=1e-5, rtol=1e-5)
                assert torch.equal(rows, torch.cat([kernel(row[None], linear.weight, linear.bias) for row in x]))
    with torch.inference_mode():
        assert fast(torch.randn(1, 0, in_features)).shape == (1, 0, out_features)  # no rows
    x = torch.randn(2, fast.max_rows // 2 + 1, in_features)  # above max_rows: PyTorch's kernel, exactly
    with torch.inference_mode():
        assert torch.equal(fast(x), linear(x))
        assert fast(x[:1, :1]).shape == (1, 1, out_features)


@pytest.mark.parametrize(("in_features", "out_features"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_int8_kernel_is_bit_identical_to_fbgemm(in_features, out_features, bias):
    torch.manual_seed(in_features * out_features)
    linear = nn.Linear(in_features, out_features, bias=bias)
    kernel = Int8Linear.from_linear(linear, small_batch=True)
    reference = Int8Linear.from_linear(linear, small_batch=False)
    assert kernel._small_batch is not None and reference._small_batch is None
    for num_rows in INT8_ROW_COUNTS:
        for magnitude in (1e-3, 1.0, 1e3):
            x = torch.randn(num_rows, in_features) * magnitude
            x[0, 0] = 50 * magnitude  # an outlier
            with torch.inference_mode():
                assert torch.equal(kernel(x), reference(x))
    with torch.inference_mode():
        assert kernel(torch.randn(1, 0, in_features)).shape == (1, 0, out_features)  # no rows
        assert torch.equal(kernel(x[None, :1]), reference(x[None, :1]))  # 3-D input
        zeros = torch.zeros(1, in_features)
        assert torch.equal(kernel(zeros), reference(zeros))
        batch = torch.randn(INT8_MAX_ROWS + 2, in_features)  # above INT8_MAX_ROWS: fbgemm; each row: the kernel
        assert torch.equal(torch.cat([kernel(row[None]) for row in batch]), kernel(batch))


def test_model_linears_are_replaced_and_agree():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 32, bias=False)).requires_grad_(False)
    x = torch.randn(1, 64)
    with torch.inference_mode():
        expected = model(x)
        assert use_small_batch_linears(model) == 2
        assert all(isinstance(model[i], SmallBatchLinear) for i in (0, 2))
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
    pointers = [model[i].weight.data_ptr() for i in (0, 2)]
    assert use_small_batch_linears(model) == 0  # already replaced, and their weights not moved again
    assert [model[i].weight.data_ptr() for i in (0, 2)] == pointers


def entry_points(name: str) -> list:
    return [getattr(torch.ops.radixlm, name), direct_kernel(name)]


@pytest.mark.parametrize("entry", [0, 1], ids=["torch.ops", "direct"])
def test_bad_inputs_raise(entry):
    linear = entry_points("small_batch_linear")[entry]
    int8_linear = entry_points("small_batch_int8_linear")[entry]
    weight = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match=f"0 to {MAX_ROWS} rows"):
        linear(torch.randn(MAX_ROWS + 1, 16), weight, None)
    with pytest.raises(RuntimeError, match="features"):
        linear(torch.randn(1, 15), weight, None)
    with pytest.raises(RuntimeError, match="bias"):
        linear(torch.randn(1, 16), weight, torch.zeros(7))
    with pytest.raises(RuntimeError, match="feature dimension"):
        linear(torch.tensor(1.0), weight, None)
    with pytest.raises(RuntimeError, match="float32"):
        linear(torch.randn(1, 16, dtype=torch.float64), weight, None)
    int8 = torch.zeros(8, 64, dtype=torch.int8)
    scales, sums = torch.ones(8), torch.zeros(8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="zero-padded"):
        int8_linear(torch.randn(1, 65), int8, scales, sums, None)
    with pytest.raises(RuntimeError, match=f"0 to {INT8_MAX_ROWS} rows"):
        int8_linear(torch.randn(INT8_MAX_ROWS + 1, 64), int8, scales, sums, None)
    with pytest.raises(RuntimeError, match="weight_sums"):
        int8_linear(torch.randn(1, 16), int8, scales, sums[:4], None)
    with pytest.raises(RuntimeError, match="feature dimension"):
        int8_linear(torch.tensor(1.0), int8, scales, sums, None)


def test_direct_entry_points_check_their_arguments():
    linear, int8_linear = direct_kernel("small_batch_linear"), direct_kernel("small_batch_int8_linear")
    with pytest.raises(TypeError, match="3 arguments"):
        linear(torch.randn(1, 16), torch.randn(8, 16))
    with pytest.raises(TypeError, match="must be a tensor"):
        linear([1.0] * 16, torch.randn(8, 16), None)
    with pytest.raises(TypeError, match="tensor or None"):
        linear(torch.randn(1, 16), torch.randn(8, 16), 0.0)
    with pytest.raises(TypeError, match="5 arguments"):
        int8_linear(torch.randn(1, 16))


def test_direct_entry_points_refuse_tensors_off_the_cpu():
    """They skip the dispatcher's device dispatch (through torch.ops a meta tensor reaches the fake kernel), so the
    kernels check devices themselves: a tensor with no CPU data must raise, never be read."""
    linear, int8_linear = direct_kernel("small_batch_linear"), direct_kernel("small_batch_int8_linear")
    with pytest.raises(RuntimeError, match="x must be a dense CPU tensor"):
        linear(torch.randn(1, 16, device="meta"), torch.randn(8, 16), None)
    with pytest.raises(RuntimeError, match="weight must be a dense CPU tensor"):
        linear(torch.randn(1, 16), torch.randn(8, 16, device="meta"), None)
    with pytest.raises(RuntimeError, match="bias must be a dense CPU tensor"):
        linear(torch.randn(1, 16), torch.randn(8, 16), torch.zeros(8, device="meta"))
    int8, scales, sums = torch.zeros(8, 64, dtype=torch.int8), torch.ones(8), torch.zeros(8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="x must be a dense CPU tensor"):
        int8_linear(torch.randn(1, 64, device="meta"), int8, scales, sums, None)
    with pytest.raises(RuntimeError, match="weight_scales must be a dense CPU tensor"):
        int8_linear(torch.randn(1, 64), int8, scales.to("meta"), sums, None)
    with pytest.raises(RuntimeError, match="weight_sums must be a dense CPU tensor"):
        int8_linear(torch.randn(1, 64), int8, scales, sums.to("meta"), None)
    with pytest.raises(RuntimeError, match="dense CPU tensor"):
        linear(torch.randn(1, 16).to_sparse(), torch.randn(8, 16), None)


@pytest.mark.parametrize("bias", [False, True])
def test_direct_entry_points_equal_the_ops(bias):
    """Same kernels, so bit-identical, for contiguous and strided inputs of any leading shape."""
    torch.manual_seed(1)
    weight = torch.randn(40, 96)
    bias_tensor = torch.randn(40) if bias else None
    rows = Int8Rows(torch.randint(-64, 65, (40, 96), dtype=torch.int8), torch.rand(40, dtype=torch.float64))
    inputs = [torch.randn(3, 96), torch.randn(2, 2, 96), torch.randn(96, 4).t(), torch.randn(1, 0, 96)]
    for x in inputs:
        ops, direct = entry_points("small_batch_linear")
        expected = ops(x, weight, bias_tensor)
        assert torch.equal(direct(x, weight, bias_tensor), expected) and expected.shape == (*x.shape[:-1], 40)
        ops, direct = entry_points("small_batch_int8_linear")
        expected = ops(x, *rows.arguments(bias_tensor))
        assert torch.equal(direct(x, *rows.arguments(bias_tensor)), expected)
        assert expected.shape == (*x.shape[:-1], 40)


def test_ops_are_opaque_to_torch_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from radixlm.model.ops import kernels_available

    assert kernels_available()
    with FakeTensorMode():
        out = torch.ops.radixlm.small_batch_linear(torch.empty(3, 16), torch.empty(8, 16), None)
        int8 = torch.ops.radixlm.small_batch_int8_linear(torch.empty(2, 16), torch.empty(8, 64, dtype=torch.int8),
                                                         torch.empty(8), torch.empty(8, dtype=torch.int32), None)
    assert out.shape == (3, 8) and int8.shape == (2, 8)
