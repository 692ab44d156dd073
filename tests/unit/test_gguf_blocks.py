"""GGUF blocks: the pure-torch dequantization against gguf-py's (exactly), and the errors of bad inputs. (The kernel's
tiles and paths: test_gguf_kernel.py.)"""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from gguf_files import random_blocks

from radixlm.model.gguf_blocks import BLOCK_FORMATS, dequantize, row_bytes

TYPES = sorted(BLOCK_FORMATS)


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
