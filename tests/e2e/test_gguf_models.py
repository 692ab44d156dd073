"""GGUF files load straight into their serving format and generate what HF generates on the same weights.

The files are tiny random-weight Llamas (`gguf_files`): one using every served block format (Q8_0, Q4_0, Q4_1,
Q4_K, Q6_K, one per role, the LM head its own), one laid out as llama-quantize's Q4_K_M (Q4_K and Q6_K, the head
tied to a Q6_K embedding). HF's reference is transformers' own GGUF loader (gguf-py's dequantization, float32).

- Dequantized (no `--quantization`): radixlm's streaming loader gives the same float32 weights, so greedy output
  equals HF's token for token.
- `--quantization gguf`: the blocks are served as they are and the activations of every linear are rounded to int8
  per 32 values (`gguf_tiles.quantize_activations`); HF's reference then runs its linears on the rounded
  activations too (`quantized_activations`). The kernel's float sums run in another order than PyTorch's GEMM and
  attention's in another than HF's, so a token may differ where HF's two best logits were within `NEAR_TIE` (as
  with int8). A row's output does not depend on the rows beside it, so every scenario gives the same tokens.
"""

from __future__ import annotations

import functools
import os
import struct

import pytest
import torch
from gguf_files import MIXED_TYPES, Q4_K_M_TYPES, VOCAB_SIZE, write_tiny_gguf

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy, hf_logit_gap
from e2e.test_greedy_matches_hf import MAX_NEW, SCENARIOS, random_prompts
from radixlm.engine.llm_engine import build_engine
from radixlm.model.gguf_blocks import dequantize
from radixlm.model.gguf_file import read_gguf
from radixlm.model.gguf_linear import GGUFEmbedding, GGUFLinear
from radixlm.model.gguf_tiles import quantize_activations
from radixlm.model.loader import gguf_source, resolve_model_dir
from radixlm.sampling_params import SamplingParams

FILES = {"mixed": MIXED_TYPES, "q4_k_m": Q4_K_M_TYPES}
# Logits (of magnitude ~8 here) this close may swap places: last-bit differences of float order, once an activation's
# rounding to 1/127 of its block's maximum flips, moved these logits by up to 0.08 (kernel against PyTorch path).
NEAR_TIE = 0.05


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    """kind -> the metadata directory of a tiny GGUF of that kind (written once; cache dir is the test's own)."""
    root = tmp_path_factory.mktemp("gguf")
    previous = os.environ.get("RADIXLM_CACHE_DIR")
    os.environ["RADIXLM_CACHE_DIR"] = str(root / "cache")

    @functools.cache
    def get(kind: str):
        return resolve_model_dir(str(write_tiny_gguf(root / f"{kind}.gguf", FILES[kind])))

    yield get
    if previous is None:
        os.environ.pop("RADIXLM_CACHE_DIR", None)
    else:
        os.environ["RADIXLM_CACHE_DIR"] = previous


class _QuantizedInput(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(quantize_activations(x))


def quantized_activations(model: torch.nn.Module) -> None:
    """HF's model with every linear's input rounded as radixlm's GGUF kernel rounds it."""
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, _QuantizedInput(module))


@pytest.fixture(scope="module")
def references(gguf_dir):
    return functools.cache(lambda kind: hf_greedy(gguf_dir(kind), random_prompts(), MAX_NEW))


@pytest.fixture(scope="module")
def quantized_references(gguf_dir):
    return functools.cache(lambda kind: hf_greedy(gguf_dir(kind), random_prompts(), MAX_NEW,
                                                  prepare=quantized_activations))


@pytest.fixture(scope="module")
def first_scenario(gguf_dir):
    return functools.cache(lambda kind: _greedy(gguf_dir(kind), quantization="gguf",
                                                **next(iter(SCENARIOS.values())))[1])


def _greedy(model_dir, **options) -> tuple[object, list[list[int]]]:
    engine = build_engine(model=str(model_dir), **options)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return engine, output_token_ids(engine, random_prompts(), params)


@pytest.mark.parametrize("kind", FILES)
def test_dequantized_gguf_matches_hf(kind, gguf_dir, references):
    engine, outputs = _greedy(gguf_dir(kind), **SCENARIOS["all-at-once"])
    assert not any(isinstance(m, (GGUFLinear, GGUFEmbedding)) for m in engine.runner.model.modules())
    assert outputs == references(kind)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("kind", FILES)
def test_gguf_blocks_match_hf_up_to_near_ties(kind, scenario, gguf_dir, quantized_references, first_scenario):
    engine, outputs = _greedy(gguf_dir(kind), quantization="gguf", **SCENARIOS[scenario])
    assert outputs == first_scenario(kind)
    model = engine.runner.model
    assert isinstance(model.lm_head, GGUFLinear) and isinstance(model.model.embed_tokens, GGUFEmbedding)
    if kind == "q4_k_m":  # the tied head shares the embedding's blocks
        assert model.lm_head.parts[0] is model.model.embed_tokens.weight_part
    # No float copy of any matrix: the only float parameters are the norms.
    assert all(p.dim() == 1 for p in model.parameters())
    num_diverged = 0
    for prompt, ours, theirs in zip(random_prompts(), outputs, quantized_references(kind), strict=True):
        if ours == theirs:
            continue
        num_diverged += 1
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        gap = hf_logit_gap(gguf_dir(kind), prompt + theirs[:first], theirs[first], ours[first],
                           prepare=quantized_activations)
        assert gap < NEAR_TIE, f"diverged from HF at token {first} where HF's logits were {gap:.4f} apart"
    # Each divergence is a near tie (checked above); with 24 greedy choices a prompt among random logits, several
    # prompts may meet one, but not most.
    assert num_diverged <= len(outputs) // 2
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0


def test_gguf_pure_torch_path_matches_kernel_path(gguf_dir, first_scenario):
    """`--attention-backend torch` runs no C++ at all (GGUF linears keep the file's rows, dequantize and multiply in
    PyTorch): the same tokens up to near-ties, as the two differ only in float summation order."""
    kernel_outputs = first_scenario("mixed")
    engine, torch_outputs = _greedy(gguf_dir("mixed"), quantization="gguf", attention_backend="torch",
                                    **SCENARIOS["all-at-once"])
    linears = [m for m in engine.runner.model.modules() if isinstance(m, GGUFLinear)]
    assert linears and all(m._kernels is None and m.parts[0].rows is not None for m in linears)
    same = sum(a == b for a, b in zip(kernel_outputs, torch_outputs, strict=True))
    assert same >= len(kernel_outputs) - 2


def test_gguf_quantization_needs_a_gguf_model(tiny_model_dir):
    with pytest.raises(ValueError, match="quantization gguf"):
        build_engine(model=str(tiny_model_dir("llama")), quantization="gguf", num_kv_blocks=16)


def test_malformed_gguf_files_are_named_errors(tmp_path, gguf_dir):
    data = gguf_source(gguf_dir("mixed")).read_bytes()
    not_gguf = tmp_path / "bad.gguf"
    not_gguf.write_bytes(b"NOPE" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(not_gguf)
    for cut in (3, 24, 1000, len(data) // 2, len(data) - 1):
        truncated = tmp_path / "truncated.gguf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"past the end|not a GGUF"):
            read_gguf(truncated)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(empty)
    # An array of 2^63 strings in a 40-byte file: refused at once, not skipped one length at a time.
    huge = tmp_path / "huge-array.gguf"
    huge.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k"
                     + struct.pack("<IIQ", 9, 8, 1 << 63) + struct.pack("<Q", 0) * 2)
    with pytest.raises(ValueError, match="past the end"):
        read_gguf(huge)


def test_gguf_embedding_matches_dequantized_rows(gguf_dir):
    engine, _ = _greedy(gguf_dir("mixed"), quantization="gguf", num_kv_blocks=64)
    embedding = engine.runner.model.model.embed_tokens
    ids = torch.tensor([[0, 5, VOCAB_SIZE - 1, 5]])
    reader = gguf_source(gguf_dir("mixed"))
    tensor = next(t for t in read_gguf(reader).tensors if t.name == "token_embd.weight")
    with open(reader, "rb") as file:
        file.seek(tensor.offset)
        rows = torch.frombuffer(bytearray(file.read(tensor.num_bytes)), dtype=torch.uint8)
    table = dequantize(rows.reshape(tensor.shape[0], -1), tensor.ggml_type, embedding.embedding_dim)
    assert torch.equal(embedding(ids), table[ids])
