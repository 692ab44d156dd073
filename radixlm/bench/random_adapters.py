"""Random-weight LoRA adapters for a model, written as PEFT writes them, for benchmarks and soaks on any model.

Every attention and MLP projection of a Llama-shaped decoder (q, k, v, o, gate, up, down, by the model's config)
gets A and B drawn from a seeded normal, scaled so the delta moves the logits without drowning the base model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig

PREFIX = "base_model.model.model.layers"


def projection_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """Projection name inside a decoder layer -> (in_features, out_features), from the model's config."""
    config = AutoConfig.from_pretrained(model_dir).get_text_config()
    hidden, intermediate = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_out = config.num_attention_heads * head_dim
    kv_out = getattr(config, "num_key_value_heads", config.num_attention_heads) * head_dim
    return {"self_attn.q_proj": (hidden, q_out), "self_attn.k_proj": (hidden, kv_out),
            "self_attn.v_proj": (hidden, kv_out), "self_attn.o_proj": (q_out, hidden),
            "mlp.gate_proj": (hidden, intermediate), "mlp.up_proj": (hidden, intermediate),
            "mlp.down_proj": (intermediate, hidden)}


def write_random_adapters(model_dir: Path, out_dir: Path, num_adapters: int, rank: int = 16,
                          seed: int = 0) -> list[tuple[str, Path]]:
    """`num_adapters` adapters of rank `rank` over every projection of every layer, as (name, directory)."""
    shapes = projection_shapes(model_dir)
    num_layers = AutoConfig.from_pretrained(model_dir).get_text_config().num_hidden_layers
    generator = torch.Generator().manual_seed(seed)
    adapters = []
    for index in range(num_adapters):
        directory = out_dir / f"lora{index}"
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for layer in range(num_layers):
            for name, (in_features, out_features) in shapes.items():
                key = f"{PREFIX}.{layer}.{name}"
                lora_a = torch.randn(rank, in_features, generator=generator) / in_features ** 0.5
                tensors[f"{key}.lora_A.weight"] = lora_a
                tensors[f"{key}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.02
        save_file(tensors, directory / "adapter_model.safetensors")
        (directory / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
            "target_modules": sorted({name.split(".")[-1] for name in shapes}),
            "base_model_name_or_path": str(model_dir)}))
        adapters.append((f"lora{index}", directory))
    return adapters
