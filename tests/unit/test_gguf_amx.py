"""The GGUF linear's AMX path (csrc/linear/gguf_amx.cpp): bfloat16 rows times the weight dequantized to bfloat16 on AMX
tiles equals `F.linear` of the same rows and the dequantized weight rounded to bfloat16, for every block format,
fused parts of mixed formats, partial tiles and row counts that are not multiples of the passes; `GGUFLinear` takes it
for bfloat16 calls from `AMX_MIN_ROWS` rows on, and never for float32 ones."""

import pytest
import torch
import torch.nn.functional as F
from gguf_files import random_blocks

from radixlm.model import gguf_linear
from radixlm.model.bf16_linear import amx_available
from radixlm.model.gguf_blocks import BLOCK_FORMATS, dequantize
from radixlm.model.gguf_linear import AMX_MIN_ROWS, PATH_AMX, PATH_BEST, GGUFLinear, WeightPart
from radixlm.model.gguf_tiles import pack_tiles
from radixlm.model.ops import extension, extension_error

needs_amx = pytest.mark.skipif(extension_error() is not None or not amx_available(),
                               reason="needs radixlm._C and a CPU with AMX-BF16")


def _parts(types: list[int], outs: list[int], in_features: int):
    blocks = [random_blocks(t, n, in_features, seed=7 * n + t) for t, n in zip(types, outs, strict=True)]
    tiles = [pack_tiles(b, t, in_features) for b, t in zip(blocks, types, strict=True)]
    weight = torch.cat([dequantize(b, t, in_features) for b, t in zip(blocks, types, strict=True)])
    return tiles, weight


def _close(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to the summation order of float32 sums and the output's bfloat16 rounding."""
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected, rtol=8e-3, atol=2e-3 * expected.abs().max().item())


@needs_amx
@pytest.mark.parametrize("ggml_type", sorted(BLOCK_FORMATS), ids=lambda t: BLOCK_FORMATS[t].name)
def test_amx_path_equals_the_dequantized_weight_in_bfloat16(ggml_type):
    kernels = extension()
    in_features = 512
    types, outs = [ggml_type, 8, ggml_type], [40, 9, 64]  # partial tiles; units of an odd number of tiles
    tiles, weight = _parts(types, outs, in_features)
    generator = torch.Generator().manual_seed(ggml_type)
    bias = torch.randn(sum(outs), generator=generator)
    for num_rows in (1, 16, 17, 32, 45, 300):
        x = torch.randn(num_rows, in_features, generator=generator).bfloat16()
        for b in (None, bias):
            out = kernels.gguf_linear(x, tiles, types, outs, b, PATH_AMX)
            _close(out, F.linear(x.float(), weight.bfloat16().float(), b))
    x3 = torch.randn(2, 3, in_features, generator=generator).bfloat16()
    assert torch.equal(kernels.gguf_linear(x3, tiles, types, outs, bias, PATH_AMX),
                       kernels.gguf_linear(x3.reshape(6, -1), tiles, types, outs, bias, PATH_AMX).reshape(2, 3, -1))


@needs_amx
def test_amx_path_with_long_rows_and_special_values():
    """K of 2,560: a unit of 16 tiles takes K in two slices (1 MiB of operands each), its partial sums kept between
    them, beside units of an odd number of tiles; a last pass of 6 rows; a NaN in x poisons its row only."""
    kernels = extension()
    tiles, weight = _parts([12, 14], [300, 40], 2560)
    x = torch.randn(70, 2560, generator=torch.Generator().manual_seed(3)).bfloat16()
    x[5, 100] = float("nan")
    out = kernels.gguf_linear(x, tiles, [12, 14], [300, 40], None, PATH_AMX)
    assert out[5].isnan().all() and not out[torch.arange(70) != 5].isnan().any()
    keep = torch.arange(70) != 5
    _close(out[keep], F.linear(x[keep].float(), weight.bfloat16().float()))


@needs_amx
def test_amx_path_refuses_float32_rows_and_takes_no_rows():
    kernels = extension()
    tiles, _ = _parts([8], [16], 64)
    with pytest.raises(RuntimeError, match="AMX path takes bfloat16"):
        kernels.gguf_linear(torch.randn(4, 64), tiles, [8], [16], None, PATH_AMX)
    assert kernels.gguf_linear(torch.randn(0, 64).bfloat16(), tiles, [8], [16], None, PATH_AMX).shape == (0, 16)


@needs_amx
def test_gguf_linear_takes_the_amx_path_for_many_bfloat16_rows(monkeypatch):
    kernels = extension()
    blocks = random_blocks(12, 32, 256, seed=4)
    linear = GGUFLinear([WeightPart.from_rows(12, blocks, 256, packed=True)], kernels=gguf_linear.gguf_kernels())
    paths = []

    def spy(*args):
        paths.append(args[-1])
        return kernels.gguf_linear(*args)

    monkeypatch.setattr(linear, "_kernels", gguf_linear.GGUFKernels(spy, linear._kernels.rows))
    for num_rows, dtype in ((AMX_MIN_ROWS - 1, torch.bfloat16), (AMX_MIN_ROWS, torch.bfloat16),
                            (500, torch.bfloat16), (500, torch.float32), (1, torch.bfloat16)):
        linear(torch.randn(num_rows, 256).to(dtype))
    assert paths == [PATH_BEST, PATH_AMX, PATH_AMX, PATH_BEST, PATH_BEST]
