"""Tiny random-weight Llama GGUF files in chosen block formats, written at test time (no downloads).

The tokenizer is a small byte-level BPE one (tests/tiny_models.py's) stored as GGUF metadata, so transformers' own
GGUF loader reads the file too and gives the independent float32 reference. Q8_0, Q4_0 and Q4_1 weights are
quantized from random floats by gguf-py; gguf-py has no K-quant quantizer, so Q4_K and Q6_K blocks are random
bytes with small finite scales (any bytes are valid blocks of those formats).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quantize

from radixlm.model.gguf_blocks import BLOCK_FORMATS, row_bytes

# Bytes per block and where its float16 scales sit, for the formats written as random bytes.
# Bytes per block and the float16 scales of the formats written as random bytes: (offset, low, high) each, chosen so
# the weights spread about as the quantized ones (std ~0.1 around 0: Q4_K's dmin 7.5 d cancels the mean of d sc q),
# else the random network's activations grow layer by layer and its logits turn chaotic.
RANDOM_BLOCKS = {Q.Q4_K: (144, ((0, 3e-4, 5e-4), (2, 2.25e-3, 3.75e-3))), Q.Q6_K: (210, ((208, 5e-5, 9e-5),))}
SHAPE = dict(hidden=256, ffn=512, layers=2, heads=4, kv_heads=2)


VOCAB_SIZE = 512  # the tiny tokenizer's tokens, padded with unused ones (random prompts use ids up to 300)


@functools.cache
def _tokenizer() -> tuple[list[str], list[str], int]:
    """The tiny test tokenizer's tokens (by id, padded to VOCAB_SIZE), merges and end-of-sequence id."""
    import json

    from tiny_models import build_tokenizer

    fast = build_tokenizer()
    model = json.loads(fast.backend_tokenizer.to_str())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    tokens += [f"<unused_{i}>" for i in range(len(tokens), VOCAB_SIZE)]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return tokens, merges, fast.convert_tokens_to_ids("<|im_end|>")


def _add_tokenizer(writer: GGUFWriter) -> int:
    """A small byte-level BPE tokenizer (tests/tiny_models.py's) as GGUF metadata: a 49k-token one made every
    GGUF parse of transformers' take seconds."""
    tokens, merges, eos = _tokenizer()
    specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 5 if t.startswith("<unused_") else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(eos)
    writer.add_pad_token_id(0)
    return len(tokens)


def _blocks(rng: np.random.Generator, rows: int, cols: int, ggml_type: Q) -> np.ndarray:
    """A [rows, cols] weight in `ggml_type`: the uint8 blocks (or floats for F32/F16)."""
    if ggml_type in (Q.F32, Q.F16):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.1).astype(
            np.float32 if ggml_type == Q.F32 else np.float16)
    if ggml_type in RANDOM_BLOCKS:
        block_bytes, scale_fields = RANDOM_BLOCKS[ggml_type]
        blocks = rng.integers(0, 256, size=(rows, cols // 256, block_bytes), dtype=np.uint8)
        for offset, low, high in scale_fields:
            scales = rng.uniform(low, high, size=(rows, cols // 256)).astype(np.float16)
            blocks[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(rows, cols // 256, 2)
        return blocks.reshape(rows, -1)
    return quantize(rng.standard_normal((rows, cols), dtype=np.float32) * 0.1, ggml_type)


# A file using every served format, one per role, the LM head its own (untied).
MIXED_TYPES = {"embedding": Q.Q8_0, "output": Q.Q6_K, "q": Q.Q4_0, "k": Q.Q4_1, "v": Q.Q6_K, "o": Q.Q8_0,
               "gate": Q.Q4_K, "up": Q.Q4_K, "down": Q.Q6_K}
# What llama-quantize's Q4_K_M writes (Q6_K for v, down and the tied embedding), head tied to the embedding.
Q4_K_M_TYPES = {"embedding": Q.Q6_K, "q": Q.Q4_K, "k": Q.Q4_K, "v": Q.Q6_K, "o": Q.Q4_K, "gate": Q.Q4_K,
                "up": Q.Q4_K, "down": Q.Q6_K}


def write_tiny_gguf(path: Path, types: dict[str, Q], seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 256) whose weights have the block formats of `types` (role -> type: embedding,
    output, q, k, v, o, gate, up, down); without an "output" entry the LM head is tied to the embedding."""
    hidden, ffn, heads, kv_heads = SHAPE["hidden"], SHAPE["ffn"], SHAPE["heads"], SHAPE["kv_heads"]
    head_dim = hidden // heads
    writer = GGUFWriter(path, "llama")
    vocab = _add_tokenizer(writer)
    writer.add_name("tiny-random-llama")
    writer.add_block_count(SHAPE["layers"])
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(head_dim)
    rng = np.random.default_rng(seed)
    tensors = [("token_embd.weight", vocab, hidden, types["embedding"])]
    if "output" in types:
        tensors.append(("output.weight", vocab, hidden, types["output"]))
    for layer in range(SHAPE["layers"]):
        b = f"blk.{layer}."
        tensors += [(b + "attn_q.weight", heads * head_dim, hidden, types["q"]),
                    (b + "attn_k.weight", kv_heads * head_dim, hidden, types["k"]),
                    (b + "attn_v.weight", kv_heads * head_dim, hidden, types["v"]),
                    (b + "attn_output.weight", hidden, heads * head_dim, types["o"]),
                    (b + "ffn_gate.weight", ffn, hidden, types["gate"]),
                    (b + "ffn_up.weight", ffn, hidden, types["up"]),
                    (b + "ffn_down.weight", hidden, ffn, types["down"])]
    for name, rows, cols, ggml_type in tensors:
        data = _blocks(rng, rows, cols, ggml_type)
        writer.add_tensor(name, data, raw_dtype=None if ggml_type in (Q.F32, Q.F16) else ggml_type)
    norms = [f"blk.{layer}.{kind}_norm.weight" for layer in range(SHAPE["layers"]) for kind in ("attn", "ffn")]
    for name in [*norms, "output_norm.weight"]:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Byte offsets of each format's float16 scale fields, made finite below (random bytes give NaN and inf).
HALF_FIELDS = {2: (0,), 3: (0, 2), 8: (0,), 12: (0, 2), 14: (208,)}


def random_blocks(ggml_type: int, out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """Random block bytes (quants and Q4_K's packed scales included) with finite random float16 scales."""
    generator = torch.Generator().manual_seed(seed)
    fmt = BLOCK_FORMATS[ggml_type]
    count = out_features * in_features // fmt.block_weights
    blocks = torch.randint(0, 256, (count, fmt.block_bytes), dtype=torch.uint8, generator=generator)
    for offset in HALF_FIELDS[ggml_type]:
        scales = (torch.rand(count, generator=generator) - 0.5) * 0.02
        blocks[:, offset:offset + 2] = scales.half().view(torch.uint8).reshape(count, 2)
    return blocks.reshape(out_features, row_bytes(ggml_type, in_features))
