"""The packed bfloat16 linear reads a view of evenly spaced rows as it is, and `silu_and_mul_padded` writes rows whose
bytes are a multiple of 1 KB apart (csrc/row_layout.h): the same numbers as contiguous rows, bit for bit."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.bf16_linear import pack_weight
from radixlm.model.ops import direct_kernel, extension_error

pytestmark = pytest.mark.skipif(
    extension_error() is not None or not direct_kernel("avx512_bf16_available")(),
    reason="needs radixlm._C on a CPU with AVX-512 BF16")


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return direct_kernel("bf16_packed_linear")(x, pack_weight(weight), weight.shape[0], None)


@pytest.mark.parametrize("k", [512, 576, 1536])  # 1,024 and 3,072 bytes: rows the kernel would copy apart
@pytest.mark.parametrize("rows", [1, 2, 13, 40])
def test_silu_and_mul_padded_writes_the_same_values_apart(rows, k):
    gate_up = torch.randn(1, rows, 2 * k).bfloat16()
    plain = direct_kernel("silu_and_mul")(gate_up)
    padded = direct_kernel("silu_and_mul_padded")(gate_up)
    assert torch.equal(plain, padded) and plain.is_contiguous()
    spaced = rows > 1 and (2 * k) % 1024 == 0
    assert padded.stride(-2) == (k + 32 if spaced else k)
    assert torch.equal(torch.ops.radixlm.silu_and_mul(gate_up, pad_rows=True), padded)
    weight = torch.randn(96, k).bfloat16()
    assert torch.equal(_linear(padded, weight), _linear(plain, weight))


@pytest.mark.parametrize("make_view", [
    lambda x: torch.nn.functional.pad(x, (0, 48))[..., :-48],  # rows 1,120 bytes apart: read in place
    lambda x: torch.nn.functional.pad(x, (0, 64))[..., :-64],  # rows 1,152 bytes apart
    lambda x: torch.nn.functional.pad(x, (0, 512))[..., :-512],  # 2,048 bytes apart: copied 1,088 bytes apart
    lambda x: x.transpose(0, 1).contiguous().transpose(0, 1),  # rows not evenly spaced: copied
    lambda x: x[:, ::2].repeat_interleave(2, dim=1),           # a copy, for completeness
    lambda x: x[:1].expand(x.shape[0], -1),                    # one row seen 24 times (stride 0): copied
    lambda x: x[:, None].expand(-1, 3, -1).flatten(0, 1)[::3],  # rows 3 K apart through a copy
    lambda x: x.as_strided((12, x.shape[1]), (x.shape[1] // 2, 1)),  # rows overlapping by half: copied
])
@pytest.mark.parametrize("k", [512, 576])  # rows the kernel pads, and rows it reads where they are
def test_the_packed_linear_reads_any_view_as_its_contiguous_copy(make_view, k):
    torch.manual_seed(0)
    x = torch.randn(24, k).bfloat16()
    weight = torch.randn(64, k).bfloat16()
    view = make_view(x)
    assert torch.equal(_linear(view, weight), _linear(view.contiguous(), weight))
    assert torch.equal(_linear(view[None], weight)[0], _linear(view.contiguous(), weight))


@pytest.mark.parametrize("width", [512, 576, 2048])
@pytest.mark.parametrize("rows", [1, 7])
def test_rms_norm_padded_writes_the_same_values_apart(rows, width):
    x, weight = torch.randn(1, rows, width).bfloat16(), torch.randn(width).bfloat16()
    plain = direct_kernel("rms_norm")(x, weight, 1e-6)
    padded = direct_kernel("rms_norm_padded")(x, weight, 1e-6)
    assert torch.equal(plain, padded)
    assert padded.stride(-2) == (width + 32 if rows > 1 and width % 512 == 0 else width)
    assert torch.equal(torch.ops.radixlm.rms_norm(x, weight, 1e-6, pad_rows=True), padded)
    as_float = direct_kernel("rms_norm_padded")(x.float(), weight.float(), 1e-6)  # float32: contiguous as ever
    assert as_float.is_contiguous()
    assert torch.equal(as_float, direct_kernel("rms_norm")(x.float(), weight.float(), 1e-6))


def test_a_model_whose_producers_pad_their_rows_gives_the_same_logits():
    """A bfloat16 Llama with hidden size 512 on the packed linears: both norms and the activation of each layer pad
    (`pad_rows_for_readers`), and the logits stay bit for bit what they were."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from radixlm.model.bf16_linear import PACKED
    from radixlm.model.fused_ops import fuse_small_ops, pad_rows_for_readers
    from radixlm.model.prepacked_linear import use_prepacked_linears

    config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).bfloat16().eval()
    fuse_small_ops(model, cpp_kernels=True)
    use_prepacked_linears(model, PACKED)
    input_ids = torch.randint(0, 300, (1, 23))
    with torch.inference_mode():
        before = model(input_ids, use_cache=False).logits
        assert pad_rows_for_readers(model) == 3 * config.num_hidden_layers
        after = model(input_ids, use_cache=False).logits
    assert torch.equal(before, after)
