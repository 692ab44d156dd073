"""The GGUF kernel: its tiles hold the file's weights exactly, every path this CPU runs (portable, AVX2, AVX-512 VNNI)
gives bit-identical results equal to the PyTorch reference (`F.linear(quantize_activations(x), dequantize(W))`) up to
float rounding, a row's result does not depend on the rows beside it, and bad inputs are named errors."""

import pytest
import torch
import torch.nn.functional as F
from gguf_files import HALF_FIELDS, random_blocks

from radixlm.model.gguf_blocks import BLOCK_FORMATS, dequantize, row_bytes
from radixlm.model.gguf_linear import PATH_AVX2, PATH_AVX512, PATH_BEST, PATH_PORTABLE, GGUFLinear, WeightPart
from radixlm.model.gguf_tiles import pack_tiles, quantize_activations, tile_bytes
from radixlm.model.ops import extension, extension_error

needs_extension = pytest.mark.skipif(extension_error() is not None,
                                     reason=f"radixlm._C is not built (scripts/install.sh): {extension_error()}")
TYPES = sorted(BLOCK_FORMATS)
NAMES = [BLOCK_FORMATS[t].name for t in TYPES]


def kernel_paths() -> list[int]:
    kernels = extension()
    return kernels.gguf_linear_paths()


def shapes(ggml_type: int) -> list[tuple[int, int]]:
    """(in, out): one and several super-blocks; whole, partial and single tiles of 16 rows; K in three slices of the
    kernel's loop (1,024, 1,024, 512)."""
    block = BLOCK_FORMATS[ggml_type].block_weights
    return [(block, 16), (2 * block, 5), (3 * max(block, 256), 37), (max(block, 256), 1), (2560, 17)]


def reference(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, bias: torch.Tensor | None = None):
    weight = dequantize(blocks, ggml_type, blocks.shape[1] // BLOCK_FORMATS[ggml_type].block_bytes *
                        BLOCK_FORMATS[ggml_type].block_weights)
    return F.linear(quantize_activations(x), weight, bias)


@needs_extension
def test_paths_of_this_cpu():
    paths = kernel_paths()
    assert paths[0] == PATH_PORTABLE and set(paths) <= {PATH_PORTABLE, PATH_AVX2, PATH_AVX512}


@needs_extension
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES)
def test_tiles_hold_the_files_weights_exactly(ggml_type):
    kernels = extension()
    for in_features, out_features in shapes(ggml_type):
        blocks = random_blocks(ggml_type, out_features, in_features, seed=in_features + out_features)
        tiles = pack_tiles(blocks, ggml_type, in_features)
        assert tiles.shape == (-(-out_features // 16), tile_bytes(ggml_type, in_features))
        ids = torch.arange(out_features)
        rows = kernels.gguf_rows(tiles, ggml_type, in_features, out_features, ids)
        assert torch.equal(rows, dequantize(blocks, ggml_type, in_features))
        picked = torch.tensor([out_features - 1, 0, out_features - 1])
        assert torch.equal(torch.ops.radixlm.gguf_rows(tiles, ggml_type, in_features, out_features, picked),
                           rows[picked])


def test_activations_are_quantized_per_32_values():
    torch.manual_seed(0)
    x = torch.randn(3, 64) * torch.tensor([1e-3, 1.0, 1e3]).reshape(3, 1)
    q = quantize_activations(x)
    steps = x.reshape(3, 2, 32).abs().amax(-1, keepdim=True) / 127
    integers = q.reshape(3, 2, 32) / steps
    assert (integers - integers.round()).abs().max() < 1e-4 and integers.abs().max().round() == 127
    assert (q - x).abs().le(steps.repeat_interleave(32, 1).reshape(3, 64) / 2 * 1.0001).all()
    special = torch.zeros(4, 32)
    special[1, 0] = 1e-45  # 127 / max overflows: the block counts as zero
    special[2, 3] = float("nan")
    special[3, 5] = float("inf")
    q = quantize_activations(special)
    assert torch.equal(q[:2], torch.zeros(2, 32)) and q[2:].isnan().all()


@needs_extension
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES)
def test_every_path_is_bit_identical_and_matches_the_reference(ggml_type):
    kernels = extension()
    torch.manual_seed(ggml_type)  # seed 171 once found a rounding tie (x / step = 60.5) the reference got wrong
    for in_features, out_features in shapes(ggml_type):
        blocks = random_blocks(ggml_type, out_features, in_features, seed=in_features + out_features)
        tiles = pack_tiles(blocks, ggml_type, in_features)
        bias = torch.randn(out_features)
        x = torch.randn(20, in_features)
        for num_rows in (1, 2, 3, 7, 8, 9, 17, 20):
            for b in (None, bias):
                expected = reference(x[:num_rows], blocks, ggml_type, b)
                outs = [kernels.gguf_linear(x[:num_rows], [tiles], [ggml_type], [out_features], b, path)
                        for path in [PATH_BEST, *kernel_paths()]]
                for out in outs[1:]:
                    assert torch.equal(out, outs[0])
                tolerance = 1e-5 * expected.abs().max().item()
                torch.testing.assert_close(outs[0], expected, atol=tolerance, rtol=0)
        x3 = x[:6].reshape(2, 3, in_features)  # leading dimensions kept; the op and the direct entry agree
        out = torch.ops.radixlm.gguf_linear(x3, [tiles], [ggml_type], [out_features], bias)
        assert out.shape == (2, 3, out_features)
        assert torch.equal(out, kernels.gguf_linear(x3, [tiles], [ggml_type], [out_features], bias))


@needs_extension
def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Decode rows, prefill chunks past a row block (128) and lone rows give the same bits for the same row."""
    kernels = extension()
    blocks = random_blocks(12, 40, 512, seed=3)
    tiles = pack_tiles(blocks, 12, 512)
    x = torch.randn(300, 512, generator=torch.Generator().manual_seed(0))
    x[7] = float("nan")  # a poisoned row poisons only itself
    x[8] = 0.0
    batched = kernels.gguf_linear(x, [tiles], [12], [40], None)
    for row in (0, 6, 8, 127, 128, 129, 299):
        assert torch.equal(kernels.gguf_linear(x[row:row + 1], [tiles], [12], [40], None), batched[row:row + 1])
    assert batched[7].isnan().all() and not batched[torch.arange(300) != 7].isnan().any()
    assert torch.equal(batched[8], torch.zeros(40))


@needs_extension
def test_parts_of_different_formats_stack_along_the_outputs():
    kernels = extension()
    types, outs, in_features = [12, 14, 8, 2], [32, 16, 5, 21], 512
    parts = [random_blocks(t, n, in_features, seed=t) for t, n in zip(types, outs, strict=True)]
    tiles = [pack_tiles(p, t, in_features) for p, t in zip(parts, types, strict=True)]
    generator = torch.Generator().manual_seed(0)
    x, bias = torch.randn(9, in_features, generator=generator), torch.randn(sum(outs), generator=generator)
    stacked = kernels.gguf_linear(x, tiles, types, outs, bias)
    alone = torch.cat([kernels.gguf_linear(x, [t], [k], [n], None) for t, k, n in zip(tiles, types, outs,
                                                                                        strict=True)], dim=1)
    assert torch.equal(stacked, alone + bias)
    linear = GGUFLinear([WeightPart.from_rows(t, p, in_features, packed=False) for t, p in zip(types, parts,
                                                                                               strict=True)], bias)
    torch.testing.assert_close(linear(x), stacked, atol=1e-5 * stacked.abs().max().item(), rtol=0)


@needs_extension
def test_kernel_rejects_bad_inputs():
    kernels = extension()
    linear, rows = kernels.gguf_linear, kernels.gguf_rows
    blocks, x = random_blocks(2, 8, 64, seed=2), torch.randn(1, 64)
    tiles = pack_tiles(blocks, 2, 64)
    bad_calls = {
        "float32": lambda: linear(x.double(), [tiles], [2], [8], None),
        "contiguous uint8": lambda: linear(x, [tiles.view(torch.int8)], [2], [8], None),
        r"\[1, 576\]": lambda: linear(x, [tiles[:, :100]], [2], [8], None),
        "multiple of 32": lambda: linear(torch.randn(1, 48), [tiles], [2], [8], None),
        "multiple of 256": lambda: linear(x, [tiles], [12], [8], None),
        "ggml type 6 is not supported": lambda: linear(x, [tiles], [6], [8], None),
        "one entry per part": lambda: linear(x, [tiles], [2, 2], [8], None),
        "1 to 8 parts": lambda: linear(x, [tiles] * 9, [2] * 9, [8] * 9, None),
        "out_features must be positive": lambda: linear(x, [tiles], [2], [0], None),
        r"\[2, 576\]": lambda: linear(x, [tiles], [2], [17], None),
        "bias": lambda: linear(x, [tiles], [2], [8], torch.zeros(7)),
        "path must be": lambda: linear(x, [tiles], [2], [8], None, 7),
        "feature dimension": lambda: linear(torch.tensor(1.0), [tiles], [2], [8], None),
        "x must be a dense CPU tensor": lambda: linear(x.to("meta"), [tiles], [2], [8], None),
        "tiles must be a dense CPU tensor": lambda: linear(x, [tiles.to("meta")], [2], [8], None),
        "id 8 is outside": lambda: rows(tiles, 2, 64, 8, torch.tensor([8])),
        "id -1 is outside": lambda: rows(tiles, 2, 64, 8, torch.tensor([-1])),
        "ids must be int64": lambda: rows(tiles, 2, 64, 8, torch.tensor([1.0])),
        "gguf_rows: tiles must be": lambda: rows(tiles[:, :10], 2, 64, 8, torch.tensor([0])),
    }
    for message, call in bad_calls.items():
        with pytest.raises(RuntimeError, match=message):
            call()
    for path in {PATH_AVX2, PATH_AVX512} - set(kernel_paths()):
        with pytest.raises(RuntimeError, match="cannot run"):
            linear(x, [tiles], [2], [8], None, path)
    assert linear(torch.randn(2, 0, 64), [tiles], [2], [8], None).shape == (2, 0, 8)
    with pytest.raises(RuntimeError, match="not supported"):
        torch.ops.radixlm.gguf_linear(x, [tiles], [6], [8], None)
    with pytest.raises(TypeError, match="5 or 6 arguments"):
        linear(x, [tiles], [2], [8])
    with pytest.raises(TypeError, match="must be a tensor"):
        linear(x.tolist(), [tiles], [2], [8], None)
    with pytest.raises(TypeError, match="list or tuple of tensors"):
        linear(x, [tiles, 3], [2, 2], [8, 8], None)
    with pytest.raises(TypeError):
        linear(x, [tiles], ["Q4_0"], [8], None)
    with pytest.raises(TypeError):
        linear(x, tiles, [2], [8], None)


@needs_extension
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES)
def test_the_kernels_packer_writes_the_references_bytes(ggml_type):
    """radixlm._C's gguf_pack_tiles (what the loader runs) against gguf_tiles.pack_tiles, over every byte: the
    padded rows' too (the output starts as 0xAB), and blocks of random bytes in every field (Q4_K's packed scales)."""
    for in_features, out_features in shapes(ggml_type):
        for blocks in (random_blocks(ggml_type, out_features, in_features, seed=in_features),
                       torch.randint(0, 256, (out_features, row_bytes(ggml_type, in_features)), dtype=torch.uint8)):
            out = torch.full((-(-out_features // 16), tile_bytes(ggml_type, in_features)), 0xAB, dtype=torch.uint8)
            torch.ops.radixlm.gguf_pack_tiles(blocks, ggml_type, in_features, out)
            assert torch.equal(out, pack_tiles(blocks, ggml_type, in_features))


@needs_extension
def test_the_kernels_packer_rejects_bad_inputs():
    blocks = random_blocks(12, 20, 256, seed=0)
    out = torch.empty(2, tile_bytes(12, 256), dtype=torch.uint8)
    pack = torch.ops.radixlm.gguf_pack_tiles
    for args, message in [((blocks, 6, 256, out), "not supported"), ((blocks, 12, 100, out), "multiple of 256"),
                          ((blocks[:, :100], 12, 256, out), r"rows must be contiguous uint8 \[N > 0, 144\]"),
                          ((blocks[:0], 12, 256, out), "rows must be"),
                          ((blocks.float(), 12, 256, out), "rows must be"),
                          ((blocks, 12, 256, out[:1]), r"out must be contiguous uint8 \[2, 2368\]"),
                          ((blocks, 12, 256, out.t()), "out must be")]:
        with pytest.raises(RuntimeError, match=message):
            pack(*args)


def test_tiles_without_the_extension_are_an_error_naming_it(monkeypatch):
    import radixlm.model.gguf_linear as gguf_linear

    monkeypatch.setattr(gguf_linear, "extension_error", lambda: "not built here")
    with pytest.raises(RuntimeError, match=r"GGUF tiles need radixlm\._C: not built here"):
        WeightPart.from_rows(12, random_blocks(12, 4, 256, seed=0), 256, packed=True)


def test_pack_tiles_rejects_bad_blocks():
    blocks = random_blocks(12, 4, 256, seed=0)
    with pytest.raises(ValueError, match=r"\[N, 144\]"):
        pack_tiles(blocks[:, :100], 12, 256)
    with pytest.raises(ValueError, match="not supported"):
        pack_tiles(blocks, 6, 256)
    with pytest.raises(ValueError, match="multiple of 256"):
        pack_tiles(blocks, 12, 100)


@needs_extension
def test_rounding_ties_round_half_to_even_as_the_reference():
    """x / step = 60.5 exactly must give 60 on both sides: the reference divides 127 by the maximum (PyTorch's
    `127.0 / t` multiplies by a rounded 1 / t and once gave 60.500004, so 61)."""
    kernels = extension()
    torch.manual_seed(171)
    x = torch.randn(20, 32)
    blocks = random_blocks(8, 32, 32, seed=0)
    tiles = pack_tiles(blocks, 8, 32)
    expected = reference(x, blocks, 8)
    torch.testing.assert_close(kernels.gguf_linear(x, [tiles], [8], [32], None), expected,
                               atol=1e-5 * expected.abs().max().item(), rtol=0)


@needs_extension
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES)
def test_largest_quants_times_largest_activations_stay_exact(ggml_type):
    """Every quant at its largest (bytes 0xff) times activations of +-127: the AVX2 path's int16 sums at their bound
    (csrc/linear/gguf_avx2.cpp, kWiden) still give the portable path's bits."""
    kernels = extension()
    in_features, out_features = 512, 16
    block_bytes = BLOCK_FORMATS[ggml_type].block_bytes
    blocks = random_blocks(ggml_type, out_features, in_features, seed=1).reshape(-1, block_bytes)
    quants = torch.ones(block_bytes, dtype=torch.bool)  # every byte but the float16 scales
    for offset in HALF_FIELDS[ggml_type]:
        quants[offset:offset + 2] = False
    blocks[:, quants] = 0xFF
    blocks = blocks.reshape(out_features, -1)
    tiles = pack_tiles(blocks, ggml_type, in_features)
    x = torch.ones(3, in_features)
    x[1] = -1.0
    x[2, ::2] = -1.0
    outs = [kernels.gguf_linear(x, [tiles], [ggml_type], [out_features], None, path) for path in kernel_paths()]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    expected = reference(x, blocks, ggml_type)
    torch.testing.assert_close(outs[0], expected, atol=1e-5 * expected.abs().max().item(), rtol=0)
