"""The GGUF kernel on bfloat16 activations (`--quantization gguf | q4_0 | q4_1 | q8_0 --dtype bfloat16`): the rows
are widened exactly, quantized as float32 rows are and multiplied in float32, and only the output is rounded, so on
every path it equals the float32 call on the same values rounded to bfloat16. The activations' quantization (scalar
on the portable path, AVX2 and AVX-512 on theirs) gives every path the same bits, special values included."""

import pytest
import torch
from gguf_files import random_blocks

from radixlm.config import ModelConfig
from radixlm.model.gguf_linear import PATH_BEST, GGUFLinear, WeightPart
from radixlm.model.gguf_tiles import pack_tiles
from radixlm.model.ops import extension, extension_error

needs_extension = pytest.mark.skipif(extension_error() is not None,
                                     reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")


def _paths() -> list[int]:
    kernels = extension()
    return [PATH_BEST, *kernels.gguf_linear_paths()]


@needs_extension
@pytest.mark.parametrize("ggml_type", [8, 2, 12])  # Q8_0, Q4_0, Q4_K
def test_bf16_rows_give_the_float32_result_rounded(ggml_type):
    kernels = extension()
    in_features = 512
    types, outs = [ggml_type, 8], [40, 9]  # two parts: a partial tile in each
    tiles = [pack_tiles(random_blocks(t, n, in_features, seed=n), t, in_features) for t, n in zip(types, outs,
                                                                                                 strict=True)]
    generator = torch.Generator().manual_seed(ggml_type)
    x = torch.randn(300, in_features, generator=generator).bfloat16()
    bias = torch.randn(sum(outs), generator=generator)
    for num_rows in (1, 9, 130, 300):  # within one row block of 128 and across it
        for b in (None, bias):
            rows = x[:num_rows]
            for path in _paths():
                out = kernels.gguf_linear(rows, tiles, types, outs, b, path)
                assert out.dtype == torch.bfloat16 and out.shape == (num_rows, sum(outs))
                expected = kernels.gguf_linear(rows.float(), tiles, types, outs, b, path).bfloat16()
                assert torch.equal(out, expected), (num_rows, path)
    x3 = x[:6].reshape(2, 3, in_features)
    assert torch.equal(torch.ops.radixlm.gguf_linear(x3, tiles, types, outs, bias),
                       kernels.gguf_linear(x[:6], tiles, types, outs, bias).reshape(2, 3, -1))


@needs_extension
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_special_blocks_are_quantized_alike_on_every_path(dtype):
    """A NaN or inf poisons its row, a block whose 127 / max overflows (1e-45) counts as zero, ties round half to
    even, whichever path quantizes them."""
    kernels = extension()
    tiles = pack_tiles(random_blocks(8, 16, 64, seed=1), 8, 64)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    x[1, 3], x[2, 40], x[3, :32] = float("nan"), float("inf"), 0.0
    x[4, :32] = 0.0
    x[4, 7] = 1e-45 if dtype == torch.float32 else 0.0
    x[5, :32] = torch.arange(32) * 0.5 - 8  # x / step lands on halves for some values
    x[6, 32:] = -3e30  # large, but its products stay finite
    rows = x.to(dtype)
    outs = [kernels.gguf_linear(rows, [tiles], [8], [16], None, path) for path in _paths()]
    for out in outs[1:]:
        assert torch.equal(out.isnan(), outs[0].isnan()) and torch.equal(out.nan_to_num(), outs[0].nan_to_num())
    assert outs[0][1:3].isnan().all() and not outs[0][[0, 3, 4, 5, 6, 7]].isnan().any()


def test_the_pytorch_path_returns_the_rows_dtype():
    blocks = random_blocks(8, 24, 64, seed=2)
    linear = GGUFLinear([WeightPart.from_rows(8, blocks, 64, packed=False)], torch.randn(24))
    x = torch.randn(3, 64)
    out = linear(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), linear(x.bfloat16().float()), atol=0.02, rtol=0.01)


def test_block_formats_take_bfloat16_and_int8_does_not():
    for name in ("gguf", "q4_0", "q4_1", "q8_0"):
        assert ModelConfig(quantization=name, dtype="bfloat16").dtype == "bfloat16"
        with pytest.raises(ValueError, match="float32 or bfloat16"):
            ModelConfig(quantization=name, dtype="float16")
    with pytest.raises(ValueError, match="needs dtype float32"):
        ModelConfig(quantization="int8", dtype="bfloat16")
