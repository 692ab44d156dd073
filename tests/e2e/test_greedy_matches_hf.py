"""Greedy output equals HF generate token for token, whatever the batching, chunking or preemption."""

import functools

import pytest
import torch
from transformers import AutoModelForCausalLM

from e2e.engine_runs import output_token_ids, run
from e2e.hf_reference import hf_greedy, hf_logit_gap
from radixlm.engine.llm_engine import build_engine
from radixlm.model.decode_stack import DecodeStack
from radixlm.model.ops import extension_error
from radixlm.sampling_params import SamplingParams

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma2"]
PROMPT_LENS = [5, 17, 40, 3, 60, 23, 1, 33]
MAX_NEW = 24
SCENARIOS = {
    "all-at-once": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=2048),
    "chunked-prefill": dict(num_kv_blocks=256, block_size=4, max_num_batched_tokens=7),
    "preemption": dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=64),
}


def random_prompts(seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=generator).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def references(tiny_model_dir):
    """arch -> HF's greedy tokens, computed once per module."""
    return functools.cache(lambda arch: hf_greedy(tiny_model_dir(arch), random_prompts(), MAX_NEW))


# bfloat16 logits (of magnitude ~5 here) this close may swap places when one output rounds the other way.
BF16_NEAR_TIE = 0.1

BACKENDS = [pytest.param("cpp", marks=pytest.mark.skipif(extension_error() is not None,
                                                        reason="radixlm._C is not built")), "torch"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_generate(arch, scenario, backend, tiny_model_dir, references):
    engine = build_engine(model=str(tiny_model_dir(arch)), attention_backend=backend, **SCENARIOS[scenario])
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = output_token_ids(engine, random_prompts(), params)
    assert outputs == references(arch)
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0, "the scenario did not force preemption"


def test_eos_stops_like_hf(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    prompts = random_prompts(seed=7)
    engine = build_engine(model=str(model_dir), num_kv_blocks=256, block_size=4)
    eos = engine.tokenizer.eos_token_id
    prompts = [[*p, eos] for p in prompts]  # eos in the prompt must not stop anything
    outputs = output_token_ids(engine, prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    assert outputs == [r[:r.index(eos) + 1] if eos in r else r for r in hf_greedy(model_dir, prompts, MAX_NEW)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_bf16_kv_cache_runs_and_mostly_agrees(arch, backend, tiny_model_dir, references):
    """A bfloat16 cache rounds K/V, so greedy output may part from float32's; on these tiny models it should
    still agree on most leading tokens."""
    engine = build_engine(model=str(tiny_model_dir(arch)), attention_backend=backend, kv_cache_dtype="bfloat16",
                          num_kv_blocks=256, block_size=4)
    assert engine.runner.kv_cache.key_caches[0].dtype == torch.bfloat16
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = output_token_ids(engine, random_prompts(), params)
    agreed = [next((i for i, (a, b) in enumerate(zip(out, ref, strict=True)) if a != b), MAX_NEW)
              for out, ref in zip(outputs, references(arch), strict=True)]
    print(f"{arch}/{backend} bf16 KV: tokens agreeing before the first difference: {agreed}")
    assert sum(agreed) >= 0.5 * MAX_NEW * len(agreed), agreed


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_int8_kv_cache_runs_and_mostly_agrees(arch, backend, tiny_model_dir, references):
    """An int8 cache quantizes K/V (a scale per token and KV head): greedy output may part from float32's, but
    should agree on most leading tokens, as bfloat16's does."""
    engine = build_engine(model=str(tiny_model_dir(arch)), attention_backend=backend, kv_cache_dtype="int8",
                          num_kv_blocks=256, block_size=4)
    assert engine.runner.kv_cache.dtype == torch.int8
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = output_token_ids(engine, random_prompts(), params)
    agreed = [next((i for i, (a, b) in enumerate(zip(out, ref, strict=True)) if a != b), MAX_NEW)
              for out, ref in zip(outputs, references(arch), strict=True)]
    print(f"{arch}/{backend} int8 KV: tokens agreeing before the first difference: {agreed}")
    assert sum(agreed) >= 0.5 * MAX_NEW * len(agreed), agreed


@pytest.mark.skipif(extension_error() is not None, reason="radixlm._C is not built")
def test_int8_kv_greedy_is_the_same_whatever_the_batching_chunking_or_preemption(tiny_model_dir):
    """With the kernel every row reads its context back from the int8 cache, so a token's numbers do not depend on
    how its prompt was chunked, batched or recomputed: every scenario gives the same tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = {name: output_token_ids(build_engine(model=str(tiny_model_dir("qwen2")), kv_cache_dtype="int8",
                                                   **scenario), random_prompts(), params)
               for name, scenario in SCENARIOS.items()}
    assert outputs["chunked-prefill"] == outputs["all-at-once"] == outputs["preemption"]


@pytest.mark.parametrize("kernel", ["onednn", "amx", "dot", "packed"])
def test_bf16_weights_prepacked_give_the_tokens_plain_bf16_gives(tiny_model_dir, monkeypatch, kernel):
    """bfloat16 linears prepacked for oneDNN (`radixlm.model.prepacked_linear`) or on a row kernel
    (`radixlm.model.bf16_linear`, AMX or AVX-512 BF16 dot products, a tied head included) change no token: the same
    engine with prepacking off gives the same greedy output. The residual adds and the MLP's activation stay apart
    here (as the plain engine does them), so only the kernels' order of summing differs; the kernels' writes that take
    them in are the next test's."""
    from radixlm.model import bf16_linear, fused_ops, prepacked_linear, serving_format

    monkeypatch.setattr(fused_ops, "plus_residual", unfused_residual_add)
    monkeypatch.setattr(serving_format, "interleave_gated_mlps", lambda model: 0)
    # The decode stack's C++ layers take the adds in the linears' writes: this test keeps the Python layers.
    monkeypatch.setattr(DecodeStack, "build", classmethod(lambda cls, model: None))

    if not serving_format.prepacking_available() or extension_error() is not None:
        pytest.skip("no oneDNN or no radixlm._C: nothing is prepacked")
    available = {"amx": bf16_linear.amx_available(), "dot": bf16_linear.dot_available(),
                 "packed": bf16_linear.dot_available(), "onednn": True}
    if not available[kernel]:
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    monkeypatch.setattr(prepacked_linear, "available_kernel", lambda: None if kernel == "onednn" else kernel)
    packed_type = {"onednn": prepacked_linear.PrepackedLinear, "packed": bf16_linear.DotPackedLinear}.get(
        kernel, bf16_linear.Bf16Linear)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    options = dict(model=str(tiny_model_dir("llama")), dtype="bfloat16", num_kv_blocks=256, block_size=4)
    prepacked = build_engine(**options)
    assert any(isinstance(m, packed_type) for m in prepacked.runner.model.modules())
    monkeypatch.setattr(serving_format, "prepacking_available", lambda: False)
    monkeypatch.setattr(serving_format, "use_widened_linears", lambda model: 0)  # plain nn.Linear: F.linear's bits
    plain = build_engine(**options)
    assert not any(isinstance(m, packed_type) for m in plain.runner.model.modules())
    ours, theirs = (output_token_ids(engine, random_prompts(), params) for engine in (prepacked, plain))
    if kernel == "onednn":
        assert ours == theirs
        return
    assert_parted_only_at_bf16_near_ties(tiny_model_dir("llama"), ours, theirs)


def unfused_residual_add(linear, x, residual):
    """`fused_ops.plus_residual` without the adds in the linears' writes: the output rounded, then the add."""
    return linear(x) if residual is None else residual + linear(x)


def test_work_in_the_linears_writes_brings_bf16_closer_to_float32(tiny_model_dir, monkeypatch):
    """On the AMX kernel a decoder layer's residual adds happen in o_proj's and down_proj's writes
    (`Bf16Linear.forward_add`) and silu(gate) * up in the gate/up projection's (`FusedGatedMLP.interleave_halves`),
    each rounded to bfloat16 once from float32 sums, where plain bfloat16 rounds the projections first: the prompt
    logprobs land nearer those of HF's float32 forward on the same bfloat16 weights (teacher-forced, so one near tie
    cannot send a whole sequence elsewhere as it can greedy tokens on this tiny random model). Mean distance when
    written: 0.0180 against 0.0195 apart (three other prompt sets: 2-4% nearer)."""
    from radixlm.model import bf16_linear, fused_ops, serving_format

    if extension_error() is not None or not bf16_linear.amx_available():
        pytest.skip("the work moves into the AMX linear's writes only")
    model_dir = tiny_model_dir("llama")
    prompts = [p for p in random_prompts(2) + random_prompts(3) if len(p) > 1]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    # HF in float32 on the weights rounded to bfloat16 as the engine holds them: what is left is the activations'.
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).float().eval()
    with torch.inference_mode():
        references = [torch.log_softmax(hf(torch.tensor([p])).logits[0].float(), -1) for p in prompts]

    def distance() -> float:
        engine = build_engine(model=str(model_dir), dtype="bfloat16", num_kv_blocks=256, block_size=4)
        results = run(engine, [(f"r{i}", p, params) for i, p in enumerate(prompts)])
        gaps = [abs(results[f"r{i}"].output.prompt_logprobs[j][p[j]].logprob - reference[j - 1, p[j]].item())
                for i, (p, reference) in enumerate(zip(prompts, references, strict=True)) for j in range(1, len(p))]
        return sum(gaps) / len(gaps)

    in_the_writes = distance()
    monkeypatch.setattr(fused_ops, "plus_residual", unfused_residual_add)
    monkeypatch.setattr(serving_format, "interleave_gated_mlps", lambda model: 0)
    apart = distance()
    assert in_the_writes < apart, (in_the_writes, apart)


def test_bf16_weights_widened_give_the_tokens_plain_bf16_gives(tiny_model_dir, monkeypatch):
    """bfloat16 linears widened to float32 by blocks (`radixlm.model.widened_linear`, what a CPU without oneDNN's
    bfloat16 runs; forced here on any CPU) change no token beyond bfloat16's near ties: the same engine with plain
    `nn.Linear`s gives the same greedy output."""
    from radixlm.model import serving_format
    from radixlm.model.widened_linear import WidenedLinear

    if extension_error() is not None:
        pytest.skip("no radixlm._C: the serving formats' kernels are off")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    options = dict(model=str(tiny_model_dir("llama")), dtype="bfloat16", num_kv_blocks=256, block_size=4,
                   max_num_batched_tokens=64)  # prefill chunks of many rows: the widened path, not F.linear's
    monkeypatch.setattr(serving_format, "prepacking_available", lambda: False)
    widened = build_engine(**options)
    assert any(isinstance(m, WidenedLinear) for m in widened.runner.model.modules())
    monkeypatch.setattr(serving_format, "use_widened_linears", lambda model: 0)
    plain = build_engine(**options)
    assert not any(isinstance(m, WidenedLinear) for m in plain.runner.model.modules())
    ours, theirs = (output_token_ids(engine, random_prompts(), params) for engine in (widened, plain))
    assert_parted_only_at_bf16_near_ties(tiny_model_dir("llama"), ours, theirs)


def assert_parted_only_at_bf16_near_ties(model_dir, ours: list[list[int]], theirs: list[list[int]]) -> None:
    """Linears summing in another order than `F.linear` may round an output to the neighbouring bfloat16 value:
    where the tokens part (at most one prompt of `random_prompts()`), the logits must have been a near tie (HF's
    bfloat16 model, teacher-forced)."""
    diverged = [(p, o, t) for p, o, t in zip(random_prompts(), ours, theirs, strict=True) if o != t]
    assert len(diverged) <= 1
    for prompt, mine, plain_tokens in diverged:
        first = next(i for i, (a, b) in enumerate(zip(mine, plain_tokens, strict=True)) if a != b)
        gap = hf_logit_gap(model_dir, prompt + plain_tokens[:first], plain_tokens[first], mine[first],
                           prepare=lambda model: model.to(torch.bfloat16))
        assert gap < BF16_NEAR_TIE, f"parted at token {first} where the logits were {gap:.4f} apart"
