"""GGUF blocks: the pure-torch dequantization against gguf-py's (exactly), the C++ kernel on every path this CPU runs
against F.linear of the dequantized weights (to float rounding), and the errors of bad inputs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from radixlm.model.decode_kernel import extension_error
from radixlm.model.gguf_blocks import (
    BLOCK_FORMATS,
    GGUF_MAX_ROWS,
    PATH_AVX2,
    PATH_BEST,
    PATH_PORTABLE,
    dequantize,
    row_bytes,
)

needs_extension = pytest.mark.skipif(extension_error() is not None,
                                     reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")

# Byte offsets of each format's float16 scale fields, made finite below (random bytes give NaN and inf).
HALF_FIELDS = {2: (0,), 3: (0, 2), 8: (0,), 12: (0, 2), 14: (208,)}
TYPES = sorted(BLOCK_FORMATS)


def random_blocks(ggml_type: int, out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """Random block bytes (quants and Q4_K's packed scales included) with finite random float16 scales."""
    generator = torch.Generator().manual_seed(seed)
    fmt = BLOCK_FORMATS[ggml_type]
    count = out_features * in_features // fmt.block_weights
    blocks = torch.randint(0, 256, (count, fmt.block_bytes), dtype=torch.uint8, generator=generator)
    for offset in HALF_FIELDS[ggml_type]:
        scales = (torch.rand(count, generator=generator) - 0.5) * 0.02
        blocks[:, offset:offset + 2] = scales.half().view(torch.uint8).reshape(count, 2)
    return blocks.reshape(out_features, row_bytes(ggml_type, in_features))


def test_formats_are_gguf_py_s():
    for ggml_type, fmt in BLOCK_FORMATS.items():
        quant_type = GGMLQuantizationType(ggml_type)
        assert fmt.name == quant_type.name
        assert GGML_QUANT_SIZES[quant_type] == (fmt.block_weights, fmt.block_bytes)


@pytest.mark.parametrize("ggml_type", TYPES, ids=[BLOCK_FORMATS[t].name for t in TYPES])
def test_dequantize_equals_gguf_py(ggml_type):
    block = BLOCK_FORMATS[ggml_type].block_weights
    for out_features, blocks_per_row in [(1, 1), (3, 2), (17, 5)]:
        in_features = block * blocks_per_row
        blocks = random_blocks(ggml_type, out_features, in_features, seed=out_features)
        expected = quants.dequantize(blocks.numpy(), GGMLQuantizationType(ggml_type))
        weights = dequantize(blocks, ggml_type, in_features)
        assert weights.dtype == torch.float32 and weights.shape == (out_features, in_features)
        np.testing.assert_array_equal(weights.numpy(), expected)
        if out_features > 1:  # rows of a larger tensor (a view at an offset)
            np.testing.assert_array_equal(dequantize(blocks[1:], ggml_type, in_features).numpy(), expected[1:])


def test_dequantize_and_row_bytes_reject_bad_arguments():
    blocks = random_blocks(2, 4, 64, seed=0)
    with pytest.raises(ValueError, match="Q5_0"):  # a ggml type, not one of ours
        row_bytes(6, 64)
    with pytest.raises(ValueError, match="999"):
        dequantize(blocks, 999, 64)
    with pytest.raises(ValueError, match="multiple of 256"):
        row_bytes(12, 300)
    with pytest.raises(ValueError, match="uint8"):
        dequantize(blocks.to(torch.int16), 2, 64)
    with pytest.raises(ValueError, match=r"\[N, 36\]"):
        dequantize(blocks[:, :18], 2, 64)
    assert row_bytes(14, 512) == 420


def kernel_paths() -> list[int]:
    import radixlm._C

    return radixlm._C.gguf_linear_paths()


@needs_extension
def test_paths_of_this_cpu():
    paths = kernel_paths()
    assert paths[0] == PATH_PORTABLE and set(paths) <= {PATH_PORTABLE, PATH_AVX2}


# (in, out): whole and partial tiles of 4 weight rows, spans of 512 weights whole and partial, one block
SHAPES = {32: [(32, 5), (96, 9), (544, 12), (1056, 3)], 256: [(256, 7), (768, 12), (1280, 5)]}


@needs_extension
@pytest.mark.parametrize("ggml_type", TYPES, ids=[BLOCK_FORMATS[t].name for t in TYPES])
def test_kernel_matches_linear_of_dequantized(ggml_type):
    import radixlm._C

    for in_features, out_features in SHAPES[BLOCK_FORMATS[ggml_type].block_weights]:
        blocks = random_blocks(ggml_type, out_features, in_features, seed=in_features + out_features)
        weight = dequantize(blocks, ggml_type, in_features)
        bias = torch.randn(out_features)
        x = torch.randn(17, in_features)
        for num_rows in range(1, 18):
            for b in (None, bias):
                expected = F.linear(x[:num_rows], weight, b)
                tolerance = 1e-5 * expected.abs().max().item()
                for path in [PATH_BEST, *kernel_paths()]:
                    out = radixlm._C.gguf_linear(x[:num_rows], blocks, ggml_type, b, path)
                    torch.testing.assert_close(out, expected, atol=tolerance, rtol=0)
        x3 = x[:6].reshape(2, 3, in_features)  # leading dimensions kept; the op and the direct entry agree
        out = torch.ops.radixlm.gguf_linear(x3, blocks, ggml_type, bias)
        assert out.shape == (2, 3, out_features)
        assert torch.equal(out, radixlm._C.gguf_linear(x3, blocks, ggml_type, bias))
        torch.testing.assert_close(out, F.linear(x3, weight, bias), atol=1e-5 * out.abs().max().item(), rtol=0)


@needs_extension
def test_kernel_row_limits():
    import radixlm._C

    blocks = random_blocks(8, 8, 64, seed=1)
    weight = dequantize(blocks, 8, 64)
    x = torch.randn(GGUF_MAX_ROWS, 64)
    torch.testing.assert_close(radixlm._C.gguf_linear(x, blocks, 8, None), F.linear(x, weight),
                               atol=1e-5 * 64, rtol=1e-5)
    assert radixlm._C.gguf_linear(torch.randn(2, 0, 64), blocks, 8, None).shape == (2, 0, 8)
    with pytest.raises(RuntimeError, match=f"0 to {GGUF_MAX_ROWS} rows"):
        radixlm._C.gguf_linear(torch.randn(GGUF_MAX_ROWS + 1, 64), blocks, 8, None)


@needs_extension
def test_kernel_rejects_bad_inputs():
    import radixlm._C

    linear = radixlm._C.gguf_linear
    blocks, x = random_blocks(2, 8, 64, seed=2), torch.randn(1, 64)
    bad_calls = {
        "float32": lambda: linear(x.double(), blocks, 2, None),
        "uint8": lambda: linear(x, blocks.view(torch.int8), 2, None),
        "18-byte blocks": lambda: linear(x, blocks[:, :35], 2, None),
        "x has 64 features, weight 32": lambda: linear(x, blocks[:, :18].contiguous(), 2, None),
        "multiple of 32": lambda: linear(torch.randn(1, 48), blocks, 2, None),
        "ggml type 6 is not supported": lambda: linear(x, blocks, 6, None),
        "bias": lambda: linear(x, blocks, 2, torch.zeros(7)),
        "path must be": lambda: linear(x, blocks, 2, None, 7),
        "feature dimension": lambda: linear(torch.tensor(1.0), blocks, 2, None),
        "contiguous": lambda: linear(x, blocks.t().contiguous().t(), 2, None),
        "x must be a dense CPU tensor": lambda: linear(x.to("meta"), blocks, 2, None),
        "blocks must be a dense CPU tensor": lambda: linear(x, blocks.to("meta"), 2, None),
    }
    for message, call in bad_calls.items():
        with pytest.raises(RuntimeError, match=message):
            call()
    with pytest.raises(RuntimeError, match="not supported"):
        torch.ops.radixlm.gguf_linear(x, blocks, 6, None)
    with pytest.raises(TypeError, match="4 or 5 arguments"):
        linear(x, blocks, 2)
    with pytest.raises(TypeError, match="must be a tensor"):
        linear(x.tolist(), blocks, 2, None)
    with pytest.raises(TypeError):
        linear(x, blocks, "Q4_0", None)
