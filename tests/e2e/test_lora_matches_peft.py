"""Greedy output with LoRA adapters equals PEFT's `PeftModel` on the same base, token for token in float32: each
adapter alone, two adapters and the base model mixed in one batch, with chunked prefill and prefix-cache hits, on
three architectures (fused q/k/v and gate/up projections, biased q/k/v, unfused projections)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from lora_adapters import build_adapter, peft_greedy

from e2e.engine_runs import assert_all_blocks_released
from radixlm.engine.llm_engine import build_engine
from radixlm.lora_request import LoRARequest
from radixlm.sampling_params import SamplingParams
from radixlm.trace.replay import Trace, replay

ARCHS = ["llama", "qwen2", "gemma2"]
PROMPT_LENS = [5, 17, 40, 3, 23, 31]
MAX_NEW = 12
SCENARIOS = {"all-at-once": dict(max_num_batched_tokens=2048), "chunked-prefill": dict(max_num_batched_tokens=7)}


def random_prompts(seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=generator).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    """arch -> (a1, a2): two adapters, every projection at rank 4, and q/v/down at rank 8 with rsLoRA."""
    @functools.cache
    def get(arch: str):
        base = tiny_model_dir(arch)
        root = tmp_path_factory.mktemp(f"lora-{arch}")
        return (LoRARequest("a1", 1, str(build_adapter(base, root / "a1", seed=1))),
                LoRARequest("a2", 2, str(build_adapter(base, root / "a2", seed=2, rank=8,
                                                       target_modules=["q_proj", "v_proj", "down_proj"],
                                                       use_rslora=True))))
    return get


@pytest.fixture(scope="module")
def references(tiny_model_dir, adapters):
    """(arch, adapter name or None) -> PEFT's greedy tokens for `random_prompts()`."""
    @functools.cache
    def get(arch: str, name: str | None):
        by_name = {lora.lora_name: lora for lora in adapters(arch)}
        adapter = None if name is None else by_name[name].lora_path
        return peft_greedy(tiny_model_dir(arch), adapter, random_prompts(), MAX_NEW)
    return get


def generate(engine, prompts, loras, prefix: str = "") -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"{prefix}{i}", prompt, params, lora_request=lora)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():  # not `drain`: the prefix cache must survive for the next call
        for output in engine.step():
            tokens[output.request_id] = output.outputs[0].token_ids
        engine.check_invariants()
    return [tokens[f"{prefix}{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_batch_matches_peft(arch, scenario, tiny_model_dir, adapters, references):
    a1, a2 = adapters(arch)
    engine = build_engine(model=str(tiny_model_dir(arch)), enable_lora=True, num_kv_blocks=256, block_size=4,
                          **SCENARIOS[scenario])
    loras = [a1, None, a2, a1, None, a2]
    expected = [references(arch, None if lora is None else lora.lora_name)[i] for i, lora in enumerate(loras)]
    assert generate(engine, random_prompts(), loras) == expected
    assert references(arch, "a1") != references(arch, None), "the adapter changes nothing: the test proves nothing"
    # Again, every prompt under each adapter: the prefixes cached above are hits for the same adapter only.
    hits_before = engine.scheduler.kv_cache_manager.stats.num_hit_tokens
    for name, lora in (("a1", a1), ("a2", a2), (None, None)):
        assert generate(engine, random_prompts(), [lora] * len(PROMPT_LENS), prefix=f"{name}-") == \
            references(arch, name)
    assert engine.scheduler.kv_cache_manager.stats.num_hit_tokens > hits_before
    assert_all_blocks_released(engine)


def test_prefixes_are_kept_apart_by_adapter(tiny_model_dir, adapters):
    """The same prompt under another adapter finds nothing cached; under the same adapter it finds its prefix."""
    a1, a2 = adapters("llama")
    engine = build_engine(model=str(tiny_model_dir("llama")), enable_lora=True, num_kv_blocks=256, block_size=4)
    prompt = random_prompts()[2]  # 40 tokens
    generate(engine, [prompt], [a1], prefix="first-")
    stats = engine.scheduler.kv_cache_manager.stats
    for lora, expect_hit in ((a2, False), (None, False), (a1, True)):
        before = stats.num_hit_tokens
        generate(engine, [prompt], [lora], prefix=f"{lora}-")
        assert (stats.num_hit_tokens > before) == expect_hit, lora
    assert_all_blocks_released(engine)


def test_unloading_drops_the_adapters_prefixes(tiny_model_dir, adapters):
    a1, _ = adapters("llama")
    engine = build_engine(model=str(tiny_model_dir("llama")), enable_lora=True, num_kv_blocks=256, block_size=4)
    generate(engine, [random_prompts()[2]], [a1])
    free_before = engine.scheduler.kv_cache_manager.num_free_blocks
    engine.loras.unload("a1")
    assert engine.scheduler.kv_cache_manager.num_free_blocks > free_before
    engine.check_invariants()
    with pytest.raises(ValueError, match="no adapter"):
        engine.loras.unload("a1")
    assert_all_blocks_released(engine)


def test_the_trace_records_each_requests_adapter_and_replays(tiny_model_dir, adapters, tmp_path):
    """Replay rebuilds the adapters' namespaces, so its prefix hits and schedule match the recorded ones."""
    a1, a2 = adapters("llama")
    trace_path = tmp_path / "lora.jsonl"
    engine = build_engine(model=str(tiny_model_dir("llama")), enable_lora=True, num_kv_blocks=256, block_size=4,
                          trace=str(trace_path))
    prompt = random_prompts()[2]
    generate(engine, [prompt, prompt], [a1, a2], prefix="one-")
    generate(engine, [prompt, prompt, prompt], [a1, a2, None], prefix="two-")
    engine.tracer.close()
    arrivals = [json.loads(line) for line in trace_path.read_text().splitlines() if '"arrival"' in line]
    assert [(a.get("lora_name"), a.get("lora_id")) for a in arrivals] == \
        [("a1", 1), ("a2", 2), ("a1", 1), ("a2", 2), (None, None)]
    num_matched, divergence = replay(Trace.load(trace_path))
    assert divergence is None, str(divergence)
    assert num_matched == len(Trace.load(trace_path).of("step"))


def test_an_adapter_in_use_is_not_unloaded_and_max_loras_holds(tiny_model_dir, adapters):
    a1, a2 = adapters("llama")
    engine = build_engine(model=str(tiny_model_dir("llama")), enable_lora=True, max_loras=1, num_kv_blocks=256,
                          block_size=4)
    engine.add_request("busy", random_prompts()[0], SamplingParams(max_tokens=4), lora_request=a1)
    with pytest.raises(ValueError, match="in use"):
        engine.loras.unload("a1")
    with pytest.raises(ValueError, match="--max-loras"):
        engine.add_request("other", random_prompts()[1], SamplingParams(max_tokens=4), lora_request=a2)
    while engine.has_unfinished_requests():
        engine.step()
    engine.loras.unload("a1")
    assert engine.add_request("other", random_prompts()[1], SamplingParams(max_tokens=4), lora_request=a2)
    base_only = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=4)
    with pytest.raises(ValueError, match="not enabled"):
        base_only.add_request("x", random_prompts()[0], SamplingParams(max_tokens=2), lora_request=a1)


@pytest.mark.parametrize("quantization", ["int8", "q8_0"])
def test_quantized_bases_take_adapters(quantization, tiny_model_dir, adapters, references):
    """int8 and GGUF-block bases: the adapter's delta rides on the quantized projection (exact deltas are
    unit-tested in test_lora_linear.py); greedy output moves with the adapter and stays close to PEFT's float32."""
    a1, _ = adapters("llama")
    engine = build_engine(model=str(tiny_model_dir("llama")), enable_lora=True, quantization=quantization,
                          num_kv_blocks=256, block_size=4)
    prompts = random_prompts()
    adapted = generate(engine, prompts, [a1] * len(prompts), prefix="a1-")
    plain = generate(engine, prompts, [None] * len(prompts), prefix="base-")
    assert adapted != plain
    if quantization != "int8":  # q8_0 also rounds activations per 32 values: far from float32 on this tiny model
        return
    reference = references("llama", "a1")
    agreed = [next((i for i, (a, b) in enumerate(zip(out, ref, strict=True)) if a != b), MAX_NEW)
              for out, ref in zip(adapted, reference, strict=True)]
    assert sum(agreed) >= 0.5 * MAX_NEW * len(agreed), agreed
