"""int8 weights: every linear is replaced, the embedding stays float32, and a row's output is its own."""

import pytest
import torch
from tiny_models import build_tiny_model
from torch import nn
from transformers import AutoModelForCausalLM

from radixlm.config import ModelConfig
from radixlm.model.quantize import Int8Linear, quantize_model


def test_quantize_model_replaces_every_linear_and_keeps_the_embedding(tmp_path):
    model_dir = build_tiny_model("llama", tmp_path, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    num_linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    embedding = model.get_input_embeddings().weight.detach().clone()
    assert quantize_model(model, "int8") == num_linears == 2 * 7 + 1
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.lm_head, Int8Linear)
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert torch.equal(model.get_input_embeddings().weight, embedding)
    with torch.inference_mode():
        logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape == (1, 3, model.config.vocab_size) and torch.isfinite(logits).all()


def test_the_kernel_weights_are_gathered_into_one_buffer_and_compute_the_same(tmp_path):
    model_dir = build_tiny_model("llama", tmp_path)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    loose = {name: Int8Linear.from_linear(m) for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    quantize_model(model, "int8")
    gathered = [(name, m) for name, m in model.named_modules() if isinstance(m, Int8Linear)]
    if gathered[0][1]._small_batch is None:
        pytest.skip("the int8 kernel is not built or not vectorised here")
    weights = [m._small_batch.weight for _, m in gathered]
    base = weights[0].data_ptr()
    assert base % (2 << 20) == 0
    assert all(w.untyped_storage().data_ptr() == weights[0].untyped_storage().data_ptr() for w in weights)
    assert [w.data_ptr() - base for w in weights] == [sum(v.numel() for v in weights[:i]) for i in range(len(weights))]
    for name, module in gathered:
        assert module._small_batch_args[0] is module._small_batch.weight
        x = torch.randn(2, module.in_features)
        with torch.inference_mode():
            assert torch.equal(module(x), loose[name](x))


def test_int8_linear_is_close_and_row_independent():
    torch.manual_seed(0)
    linear = nn.Linear(96, 80)
    quantized = Int8Linear.from_linear(linear)
    x = torch.randn(6, 96)
    with torch.inference_mode():
        reference, out = linear(x), quantized(x)
        assert ((out - reference).norm() / reference.norm()).item() < 0.03
        assert torch.equal(quantized(x[2:3]), out[2:3])  # alone or in a batch: the same row
        assert torch.equal(quantized(x[None])[0], out)  # 3-D input
        x[4] *= 1000  # an outlier row does not change the others' scales
        assert torch.equal(quantized(x)[:4], out[:4])
        assert torch.equal(quantized(torch.zeros(2, 96)), linear.bias.detach().expand(2, 80))


def test_quantization_config_is_validated():
    assert ModelConfig(quantization="int8").quantization == "int8"
    with pytest.raises(ValueError, match="quantization"):
        ModelConfig(quantization="int4")
    with pytest.raises(ValueError, match="float32"):
        ModelConfig(quantization="int8", dtype="bfloat16")
