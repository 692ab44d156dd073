"""Random-weight PEFT LoRA adapters for the tiny test models, made with PEFT itself, and PEFT's greedy reference."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_adapter(base_dir: Path, out_dir: Path, seed: int, rank: int = 4, alpha: float = 8.0,
                  target_modules: Sequence[str] = ALL_PROJECTIONS, **options: object) -> Path:
    """Save a LoRA adapter of `base_dir` with random A and B (PEFT's `init_lora_weights=False`) into `out_dir`."""
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules), init_lora_weights=False,
                        **options)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(4.0)  # a delta large enough to change greedy choices
    model.save_pretrained(out_dir)
    return out_dir


def peft_greedy(base_dir: Path, adapter_dir: Path | None, prompts: list[list[int]], max_new_tokens: int,
                ) -> list[list[int]]:
    """PEFT's `PeftModel` on the float32 base (or the base alone), HF `generate`, greedy, one prompt at a time."""
    from e2e.hf_reference import hf_greedy

    prepare = None if adapter_dir is None else (lambda model: PeftModel.from_pretrained(model, adapter_dir))
    return hf_greedy(base_dir, prompts, max_new_tokens, prepare=prepare)
