"""Reference outputs from HF `generate` on the same weights, one prompt at a time (no padding)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from radixlm.engine.llm_engine import LLMEngine
from radixlm.sampling_params import SamplingParams


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = False,
              prepare: Callable[[torch.nn.Module], object] | None = None) -> list[list[int]]:
    """HF `generate`, greedy, one prompt at a time; `prepare(model)` may change the loaded model first."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if prepare is not None:
        prepare(model)
    if not stop_at_eos:
        model.generation_config.eos_token_id = None
    outputs = []
    for prompt in prompts:
        with torch.inference_mode():
            generated = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                       dtype=torch.long), max_new_tokens=max_new_tokens, do_sample=False,
                                       pad_token_id=0)
        outputs.append(generated[0, len(prompt):].tolist())
    return outputs


def run_engine(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Submit everything at once; check invariants after every step; return output token ids per prompt."""
    for index, prompt in enumerate(prompts):
        engine.add_request(f"req-{index}", prompt, params)
    finished: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0].token_ids
        engine.check_invariants()
    assert_all_blocks_released(engine)
    return [finished[f"req-{index}"] for index in range(len(prompts))]


def assert_all_blocks_released(engine: LLMEngine) -> None:
    """With no live request, only the radix tree holds blocks; after evicting it, every block is free."""
    manager = engine.scheduler.kv_cache_manager
    tree_blocks = set(manager.radix_cache.block_refs()) if manager.radix_cache else set()
    assert manager.block_pool.num_used_blocks == len(tree_blocks), "blocks leaked after all requests finished"
    manager.reset_prefix_cache()
    assert manager.num_free_blocks == manager.num_blocks, "blocks leaked after evicting the prefix cache"
