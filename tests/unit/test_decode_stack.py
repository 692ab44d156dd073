"""The decode stack (radixlm.model.decode_stack, csrc/layers/decode_layers.cpp): every layer of a decode step in one
C++ call gives the Python layers' logits bit for bit, and the same greedy tokens; it is built only where it applies,
and its entry points refuse malformed plans with a Python error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_files import Q4_K_M_TYPES, write_tiny_gguf

from radixlm.engine.llm_engine import build_engine
from radixlm.model.decode_stack import STACK_PARTS
from radixlm.model.loader import resolve_model_dir
from radixlm.model.ops import direct_kernel, extension_error
from radixlm.sampling_params import SamplingParams

needs_extension = pytest.mark.skipif(extension_error() is not None, reason="radixlm._C is not built")


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model_dir(str(write_tiny_gguf(tmp_path_factory.mktemp("stack") / "q4_k_m.gguf", Q4_K_M_TYPES)))


def _engine(model: Path, **options: object):
    return build_engine(model=str(model), dtype="bfloat16", num_kv_blocks=256, block_size=4,
                        enable_prefix_caching=False, **options)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(5, 200, (length,), generator=generator).tolist() for length in (3, 9, 21, 6)]


def _generate(engine, prompts: list[list[int]], max_tokens: int = 12) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}-{id(prompts)}", prompt, params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = list(output.outputs[0].token_ids)
    return [tokens[key] for key in sorted(tokens, key=lambda key: int(key[1:].split("-")[0]))]


def _check_stack(engine) -> None:
    """Greedy tokens with the stack equal those of the Python layers (each run on its own, so that K/V written by
    one path feed only its own later steps); then, step by step, the stack's logits and the Python layers' on the
    same batch (which write the same K/V again) are equal bit for bit."""
    runner = engine.runner
    stack = runner.decode_stack
    assert stack is not None
    calls = []
    plain = stack.logits

    def counted(batch):
        calls.append(batch.input_ids.shape[1])
        return plain(batch)

    def both(batch):
        logits = plain(batch)
        reference = runner.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                                 logits_to_keep=batch.logits_indices, radix_attn=batch.attn_metadata).logits
        assert torch.equal(logits, reference)
        return logits

    prompts = _prompts()
    stack.logits = counted
    with_stack = _generate(engine, prompts)
    # the batched decode steps ran through it (over a float32 cache a prefill's rows all attend as decodes too)
    assert len(prompts) in calls
    runner.decode_stack = None
    assert _generate(engine, prompts) == with_stack
    runner.decode_stack = stack
    stack.logits = both
    assert _generate(engine, prompts, max_tokens=4) == [tokens[:4] for tokens in with_stack]


@needs_extension
def test_gguf_stack_matches_python_layers(gguf_dir: Path) -> None:
    """GGUF blocks (Q4_K and Q6_K) in bfloat16: the GGUF kernels run on every CPU with the extension."""
    _check_stack(_engine(gguf_dir, quantization="gguf"))


@needs_extension
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_amx_stack_matches_python_layers(tiny_model_dir, arch: str) -> None:
    """bfloat16 linears on the AMX kernel (the gated MLP's too), where the CPU has AMX."""
    from radixlm.model import bf16_linear

    if not bf16_linear.amx_available():
        pytest.skip("this CPU has no AMX-BF16")
    engine = _engine(tiny_model_dir(arch))
    if engine.runner.decode_stack is None:
        pytest.skip("the tiny model's linears are not all on the AMX kernel here")
    _check_stack(engine)


@needs_extension
def test_gguf_float32_stack_matches_python_layers(gguf_dir: Path) -> None:
    """GGUF blocks with float32 rows: the MLP's silu(gate) * up by PyTorch's ops, as FusedGatedMLP does."""
    engine = build_engine(model=str(gguf_dir), quantization="gguf", dtype="float32", num_kv_blocks=256, block_size=4,
                          enable_prefix_caching=False)
    assert engine.runner.decode_stack.dtype == torch.float32
    _check_stack(engine)


@needs_extension
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_float32_stack_matches_python_layers(tiny_model_dir, arch: str) -> None:
    """float32 linears on the small-batch kernel (F.linear above its rows), as `radixlm serve` runs by default."""
    engine = build_engine(model=str(tiny_model_dir(arch)), num_kv_blocks=256, block_size=4,
                          enable_prefix_caching=False)
    assert engine.runner.decode_stack is not None
    _check_stack(engine)


@needs_extension
def test_not_built_where_it_does_not_apply(gguf_dir: Path, tiny_model_dir) -> None:
    """Adapters (their deltas run around the projections) and int8 linears keep the Python layers."""
    assert _engine(gguf_dir, quantization="gguf", enable_lora=True).runner.decode_stack is None
    assert build_engine(model=str(tiny_model_dir("llama")), quantization="int8", num_kv_blocks=64,
                        block_size=4).runner.decode_stack is None


@needs_extension
@pytest.mark.parametrize("layers, error", [
    (None, TypeError),  # not a list
    ([(1, 2)], TypeError),  # a layer tuple of the wrong length
    ([(torch.ones(4), 1e-6, torch.ones(4), 1e-6, (9, None, None, 0, (), (), (), 0), None, None, None, 1, 1, 4, 0.5,
       0)], ValueError),  # an unknown linear kind
    ([(torch.ones(4), 1e-6, torch.ones(4), 1e-6, *[(2, None, None, 0, (), (), (), 0)] * 4, 1, 1, 4, 0.5, 0)],
     ValueError),  # a GGUF linear without tiles
])
def test_plan_refuses_malformed_layers(layers: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        direct_kernel("decode_plan")(layers)


@needs_extension
def test_layers_refuse_mismatched_caches(gguf_dir: Path) -> None:
    """A call whose caches do not match the plan is a RuntimeError, not a crash."""
    stack = _engine(gguf_dir, quantization="gguf").runner.decode_stack
    assert stack is not None
    hidden = torch.zeros(1, 1, 256, dtype=torch.bfloat16)
    table = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="one key and one value cache per layer"):
        stack._run(stack._plan, hidden, hidden, hidden, [], [], None, None, table, table, table + 1,
                   torch.zeros(1, dtype=torch.long), 4, None)


@needs_extension
def test_part_timers_leave_tokens_alone(gguf_dir: Path) -> None:
    """With its part timers on the stack gives the same tokens and a positive time for every part it ran; timers of
    the wrong dtype or size are a ValueError, not a write past their end."""
    engine = _engine(gguf_dir, quantization="gguf")
    stack = engine.runner.decode_stack
    assert stack is not None
    prompts = _prompts()
    plain = _generate(engine, prompts)
    stack.time_parts(True)
    assert _generate(engine, prompts) == plain
    assert stack.part_seconds is not None
    seconds = dict(zip(STACK_PARTS, stack.part_seconds.tolist(), strict=True))
    assert all(value > 0 for value in seconds.values()), seconds
    stack.time_parts(False)
    assert stack.part_seconds is None
    hidden = torch.zeros(1, 1, 256, dtype=torch.bfloat16)
    table = torch.zeros(1, dtype=torch.int32)
    cache = engine.runner.kv_cache
    for bad in (torch.zeros(len(STACK_PARTS)), torch.zeros(len(STACK_PARTS) - 1, dtype=torch.float64)):
        with pytest.raises(ValueError, match="part_seconds"):
            stack._run(stack._plan, hidden, hidden, hidden, cache.key_caches, cache.value_caches, None, None, table,
                       table, table + 1, torch.zeros(1, dtype=torch.long), 4, bad)
