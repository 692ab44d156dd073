"""Reference outputs from HF `generate` on the same weights, one prompt at a time (no padding)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForCausalLM

from radixlm.model.loader import float32_checkpoint


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = False,
              prepare: Callable[[torch.nn.Module], object] | None = None) -> list[list[int]]:
    """HF `generate`, greedy, one prompt at a time; `prepare(model)` may change the loaded model first, or return a
    module that replaces it."""
    model = _load(model_dir, prepare)
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


def hf_logit_gap(model_dir: Path, token_ids: list[int], first: int, second: int,
                 prepare: Callable[[torch.nn.Module], object] | None = None) -> float:
    """|logit(first) - logit(second)| of HF's model for the token after `token_ids` (teacher-forced): how near a
    tie two greedy choices were."""
    model = _load(model_dir, prepare)
    with torch.inference_mode():
        logits = model(torch.tensor([token_ids])).logits[0, -1]
    return abs(logits[first].item() - logits[second].item())


def hf_embeddings(model_dir: Path, prompts: list[list[int]], pooling: str) -> list[list[float]]:
    """HF's base model (`AutoModel`: the decoder without its LM head), one prompt at a time: its
    `last_hidden_state` pooled by `pooling` ("last" or "mean"), L2-normalized, in float32."""
    model = AutoModel.from_pretrained(float32_checkpoint(model_dir), dtype=torch.float32).eval()
    vectors = []
    for prompt in prompts:
        with torch.inference_mode():
            hidden = model(torch.tensor([prompt])).last_hidden_state[0]
        pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
        vectors.append(F.normalize(pooled, dim=-1).tolist())
    return vectors


def _load(model_dir: Path, prepare: Callable[[torch.nn.Module], object] | None) -> torch.nn.Module:
    # A GGUF model's float32 copy is made by transformers' own GGUF loader: independent of radixlm's streaming one.
    model = AutoModelForCausalLM.from_pretrained(float32_checkpoint(model_dir), dtype=torch.float32).eval()
    if prepare is not None:
        prepared = prepare(model)
        if isinstance(prepared, torch.nn.Module):  # a wrapper of the model (PEFT's) replaces it
            model = prepared
    return model
