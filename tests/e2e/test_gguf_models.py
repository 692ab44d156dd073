"""GGUF files load straight into their serving format and generate what HF generates on the same weights.

The files are tiny random-weight Llamas (`gguf_files`): one using every served block format (Q8_0, Q4_0, Q4_1,
Q4_K, Q6_K, one per role, the LM head its own), one laid out as llama-quantize's Q4_K_M (Q4_K and Q6_K, the head
tied to a Q6_K embedding). HF's reference is transformers' own GGUF loader (gguf-py's dequantization, float32).

- Dequantized (no `--quantization`): radixlm's streaming loader gives the same float32 weights, so greedy output
  equals HF's token for token.
- `--quantization gguf`: the blocks are served as they are; the kernel's float sums run in another order than
  PyTorch's GEMM, so a token may differ where HF's two best logits were within `NEAR_TIE` (as with int8).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from gguf_files import MIXED_TYPES, Q4_K_M_TYPES, write_tiny_gguf

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy, hf_logit_gap
from e2e.test_greedy_matches_hf import MAX_NEW, SCENARIOS, random_prompts
from radixlm.engine.llm_engine import build_engine
from radixlm.model.gguf_blocks import dequantize
from radixlm.model.gguf_file import read_gguf
from radixlm.model.gguf_linear import GGUFEmbedding, GGUFLinear
from radixlm.model.loader import gguf_source, resolve_model_dir
from radixlm.sampling_params import SamplingParams

FILES = {"mixed": MIXED_TYPES, "q4_k_m": Q4_K_M_TYPES}
NEAR_TIE = 0.02


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


@pytest.fixture(scope="module")
def references(gguf_dir):
    return functools.cache(lambda kind: hf_greedy(gguf_dir(kind), random_prompts(), MAX_NEW))


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
def test_gguf_blocks_match_hf_up_to_near_ties(kind, scenario, gguf_dir, references):
    engine, outputs = _greedy(gguf_dir(kind), quantization="gguf", **SCENARIOS[scenario])
    model = engine.runner.model
    assert isinstance(model.lm_head, GGUFLinear) and isinstance(model.model.embed_tokens, GGUFEmbedding)
    if kind == "q4_k_m":  # the tied head shares the embedding's blocks
        assert model.lm_head.parts[0].blocks is model.model.embed_tokens.weight_blocks.blocks
    # No float copy of any matrix: the only float parameters are the norms.
    assert all(p.dim() == 1 for p in model.parameters())
    num_diverged = 0
    for prompt, ours, theirs in zip(random_prompts(), outputs, references(kind), strict=True):
        if ours == theirs:
            continue
        num_diverged += 1
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        gap = hf_logit_gap(gguf_dir(kind), prompt + theirs[:first], theirs[first], ours[first])
        assert gap < NEAR_TIE, f"diverged from HF at token {first} where HF's logits were {gap:.4f} apart"
    assert num_diverged <= 1
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0


def test_gguf_pure_torch_path_matches_kernel_path(gguf_dir):
    """`--attention-backend torch` runs no C++ at all (GGUF linears dequantize and multiply in PyTorch): the same
    tokens up to near-ties, as the two differ only in float summation order."""
    _, kernel_outputs = _greedy(gguf_dir("mixed"), quantization="gguf", **SCENARIOS["all-at-once"])
    engine, torch_outputs = _greedy(gguf_dir("mixed"), quantization="gguf", attention_backend="torch",
                                    **SCENARIOS["all-at-once"])
    assert all(m._kernel is None for m in engine.runner.model.modules() if isinstance(m, GGUFLinear))
    same = sum(a == b for a, b in zip(kernel_outputs, torch_outputs, strict=True))
    assert same >= len(kernel_outputs) - 1


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


def test_gguf_embedding_matches_dequantized_rows(gguf_dir):
    engine, _ = _greedy(gguf_dir("mixed"), quantization="gguf", num_kv_blocks=64)
    embedding = engine.runner.model.model.embed_tokens
    ids = torch.tensor([[0, 5, 49151, 5]])
    table = dequantize(embedding.weight_blocks.blocks, embedding.weight_blocks.ggml_type, embedding.embedding_dim)
    assert torch.equal(embedding(ids), table[ids])
