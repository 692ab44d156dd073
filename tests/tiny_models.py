"""Tiny random-weight models built from configs at test time (no downloads), with a small trained tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a paged KV cache stores keys and values in fixed size blocks",
    "continuous batching mixes prefill chunks with decode steps",
    "radix trees share common prefixes between requests",
    "héllo wörld ünïcode, 你好世界, emoji 🙂 and numbers 0123456789",
    "import torch; print(torch.zeros(3))",
]
VOCAB_SIZE = 384  # the model's vocabulary is larger than the tokenizer's, as with many real checkpoints

ARCHS = {
    "llama": (LlamaConfig, {}),
    "qwen2": (Qwen2Config, {}),
    "qwen3": (Qwen3Config, {"head_dim": 16}),
    "mistral": (MistralConfig, {"sliding_window": 24}),
    "gemma2": (Gemma2Config, {"sliding_window": 24, "head_dim": 16, "query_pre_attn_scalar": 16,
                              "attn_logit_softcapping": 20.0, "final_logit_softcapping": 15.0}),
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(arch: str, out_dir: Path, seed: int = 0, **overrides: object) -> Path:
    """Save a random-weight `arch` model and a tokenizer into `out_dir`; returns `out_dir`."""
    config_cls, extra = ARCHS[arch]
    tokenizer = build_tokenizer()
    values: dict[str, object] = dict(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    values.update(extra)
    values.update(overrides)
    config = config_cls(**values)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
