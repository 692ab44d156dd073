"""--device and --dtype auto: resolution on any machine; greedy equality with HF on CUDA where there is a GPU."""

import pytest
import torch

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy
from e2e.test_greedy_matches_hf import MAX_NEW, SCENARIOS, random_prompts
from radixlm.config import ModelConfig
from radixlm.engine.llm_engine import build_engine
from radixlm.model.device import resolve_device, resolve_dtype, to_device
from radixlm.model.runner import _attention_backend
from radixlm.sampling_params import SamplingParams

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def test_auto_picks_what_torch_sees() -> None:
    device = resolve_device("auto")
    assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")


def test_cpu_only_paths_are_refused_on_cuda() -> None:
    cuda = torch.device("cuda")
    with pytest.raises(ValueError, match="CPU only"):
        _attention_backend(ModelConfig(quantization="int8"), cuda)
    with pytest.raises(ValueError, match="CPU kernel"):
        _attention_backend(ModelConfig(attention_backend="cpp"), cuda)
    assert _attention_backend(ModelConfig(), cuda) == "torch"


def test_host_tensors_stay_put_on_cpu() -> None:
    tensor = torch.arange(4)
    assert to_device(tensor, torch.device("cpu")) is tensor


@needs_cuda
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2"])
def test_greedy_matches_hf_on_cuda(arch, scenario, tiny_model_dir) -> None:
    engine = build_engine(model=str(tiny_model_dir(arch)), device="cuda", dtype="float32", **SCENARIOS[scenario])
    assert engine.runner.kv_cache.device.type == "cuda"
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    assert output_token_ids(engine, random_prompts(), params) == hf_greedy(tiny_model_dir(arch), random_prompts(),
                                                                           MAX_NEW)


@needs_cuda
def test_bfloat16_is_the_cuda_default(tiny_model_dir) -> None:
    engine = build_engine(model=str(tiny_model_dir("llama")), device="cuda", num_kv_blocks=64, block_size=4)
    assert engine.runner.dtype == torch.bfloat16
    outputs = output_token_ids(engine, random_prompts()[:2], SamplingParams(temperature=0.0, max_tokens=8))
    assert all(len(tokens) >= 1 for tokens in outputs)


@needs_cuda
def test_speculation_and_prefix_hits_on_cuda(tiny_model_dir) -> None:
    """n-gram drafts verified on the GPU, then every prompt again from the radix tree: HF's tokens both times."""
    from e2e.test_speculative import MAX_NEW as SPEC_NEW
    from e2e.test_speculative import SPEC, greedy_run, repetitive_prompts

    model_dir = tiny_model_dir("llama")
    engine = build_engine(model=str(model_dir), device="cuda", dtype="float32", speculative_config=SPEC,
                          num_kv_blocks=256, block_size=4)
    reference = hf_greedy(model_dir, repetitive_prompts(), SPEC_NEW)
    assert greedy_run(engine, repetitive_prompts()) == reference
    for index, prompt in enumerate(repetitive_prompts()):  # prompts and outputs stay in the radix tree
        engine.add_request(f"warm-{index}", prompt, SamplingParams(temperature=0.0, max_tokens=SPEC_NEW))
    while engine.has_unfinished_requests():
        engine.step()
    assert greedy_run(engine, repetitive_prompts()) == reference
    assert engine.scheduler.kv_cache_manager.stats.num_hit_tokens > 0
    assert engine.drafter.stats.num_accepted_tokens > 0


@needs_cuda
def test_host_tier_under_a_cuda_cache(tiny_model_dir) -> None:
    """Prefixes evicted from a small GPU cache come back from pinned host memory with the tokens recomputing gives."""
    from e2e.test_kv_offload_engine import _outputs

    model = str(tiny_model_dir("llama"))
    recomputed, _ = _outputs(model, device="cuda", dtype="float32")
    loaded, engine = _outputs(model, device="cuda", dtype="float32", kv_offload_memory="1MiB")
    assert engine.scheduler.kv_cache_manager.offload.stats.num_loaded_blocks > 0
    assert loaded == recomputed
