"""HF checkpoints quantized at load (`--quantization q4_0 | q4_1 | q8_0 | int8`) stream layer by layer into their
serving format, and generate what HF generates on the same quantized weights.

- q4_0 / q4_1 / q8_0: gguf-py quantizes every linear and the embedding to that GGUF block format; HF's reference runs
  on those blocks' dequantized weights with its linears' inputs rounded as the GGUF kernel rounds them, so tokens
  agree up to near-ties (as in test_gguf_models.py).
- Streaming: while loading, at most one decoder layer holds float matrices.
"""

from __future__ import annotations

import functools

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import quantize as gguf_quantize

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy, hf_logit_gap
from e2e.test_gguf_models import NEAR_TIE, quantized_activations
from e2e.test_greedy_matches_hf import MAX_NEW, SCENARIOS, random_prompts
from radixlm.engine.llm_engine import build_engine
from radixlm.model import checkpoint_loader
from radixlm.model.gguf_blocks import dequantize
from radixlm.model.gguf_linear import GGUFEmbedding, GGUFLinear
from radixlm.model.layer_stream import LayerTracker
from radixlm.model.quantize import Int8Linear
from radixlm.model.serving_format import ServingFormat
from radixlm.sampling_params import SamplingParams

FORMATS = {"q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}


def _round_trip(weight: torch.Tensor, ggml_type: GGMLQuantizationType) -> torch.Tensor:
    rows = torch.from_numpy(gguf_quantize(weight.detach().float().numpy(), ggml_type))
    return dequantize(rows, int(ggml_type), weight.shape[1])


def blocks_reference(ggml_type: GGMLQuantizationType):
    """HF's model on the weights a q-format load serves, its linears' inputs rounded as the GGUF kernel does."""
    def prepare(model: torch.nn.Module) -> None:
        with torch.no_grad():
            for module in [*model.modules()]:
                if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    module.weight.copy_(_round_trip(module.weight, ggml_type))
        quantized_activations(model)
    return prepare


@pytest.fixture(scope="module")
def references(tiny_model_dir):
    return functools.cache(lambda name: hf_greedy(tiny_model_dir("llama"), random_prompts(), MAX_NEW,
                                                  prepare=blocks_reference(FORMATS[name])))


@pytest.mark.parametrize("name", FORMATS)
def test_block_formats_match_hf_on_the_same_blocks(name, tiny_model_dir, references):
    engine = build_engine(model=str(tiny_model_dir("llama")), quantization=name, **SCENARIOS["chunked-prefill"])
    model = engine.runner.model
    assert isinstance(model.lm_head, GGUFLinear) and isinstance(model.model.embed_tokens, GGUFEmbedding)
    assert all(p.dim() == 1 for p in model.parameters())  # no float matrix left: only the norms
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = output_token_ids(engine, random_prompts(), params)
    num_diverged = 0
    for prompt, ours, theirs in zip(random_prompts(), outputs, references(name), strict=True):
        if ours == theirs:
            continue
        num_diverged += 1
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        gap = hf_logit_gap(tiny_model_dir("llama"), prompt + theirs[:first], theirs[first], ours[first],
                           prepare=blocks_reference(FORMATS[name]))
        assert gap < NEAR_TIE, f"diverged from HF at token {first} where HF's logits were {gap:.4f} apart"
    assert num_diverged <= len(outputs) // 2  # each at a near tie, as in test_gguf_models.py


@pytest.mark.parametrize("name", ["int8", "q4_1"])
def test_a_quantized_load_holds_one_float_layer_at_most(name, tiny_model_dir, monkeypatch):
    """Each decoder layer is quantized as soon as its last tensor is read: when a layer is finished, no other layer
    holds a float matrix."""
    models, float_layers = [], []
    track = LayerTracker.__init__
    finish = ServingFormat.finish_layer

    def tracking(self, model, finish_layer):
        models.append(model)
        track(self, model, finish_layer)

    def finishing(self, layer):
        float_layers.append({n.split(".")[2] for n, p in models[-1].named_parameters()
                             if p.dim() == 2 and not p.is_meta and ".layers." in n})
        finish(self, layer)

    monkeypatch.setattr(LayerTracker, "__init__", tracking)
    monkeypatch.setattr(ServingFormat, "finish_layer", finishing)
    engine = build_engine(model=str(tiny_model_dir("llama")), quantization=name, num_kv_blocks=64)
    assert float_layers[:2] == [{"0"}, {"1"}], float_layers  # then finish_model's call on the whole model
    linear_type = Int8Linear if name == "int8" else GGUFLinear
    assert isinstance(engine.runner.model.model.layers[0].mlp.down_proj, linear_type)


def test_a_checkpoint_without_safetensors_is_a_named_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="safetensors"):
        checkpoint_loader.safetensors_files(tmp_path)
