"""What tensor parallelism asks of a model: a tensor-parallel plan in transformers, and head counts it can split.

transformers shards the projections column-wise by output features; our attention and KV cache work on whole
heads, so every rank must get whole query and KV heads. transformers does not replicate KV heads when the group is
larger than their count, so such a split is refused here with the numbers that would work.
"""

from __future__ import annotations

from transformers import PretrainedConfig


def check_tensor_parallel(config: PretrainedConfig, tensor_parallel_size: int, quantization: str | None) -> None:
    """Raise ValueError unless `config`'s architecture can run on `tensor_parallel_size` ranks."""
    text = config.get_text_config()
    architecture = (config.architectures or [config.model_type])[0]
    if not getattr(text, "base_model_tp_plan", None):
        raise ValueError(f"tensor_parallel_size {tensor_parallel_size}: {architecture} has no tensor-parallel plan "
                         f"in transformers (base_model_tp_plan), so it cannot be sharded; use "
                         f"--tensor-parallel-size 1")
    if quantization is not None:
        raise ValueError(f"quantization {quantization} does not support tensor_parallel_size > 1 (its int8 linears "
                         f"are not sharded by transformers' plan); drop one of them")
    num_heads = text.num_attention_heads
    num_kv_heads = getattr(text, "num_key_value_heads", None) or num_heads
    if num_heads % tensor_parallel_size or num_kv_heads % tensor_parallel_size:
        sizes = [n for n in range(1, num_kv_heads + 1) if num_kv_heads % n == 0 and num_heads % n == 0]
        raise ValueError(f"tensor_parallel_size {tensor_parallel_size} must divide {architecture}'s "
                         f"{num_heads} attention heads and {num_kv_heads} KV heads (each rank holds whole heads; "
                         f"transformers' plan does not replicate KV heads); sizes that work: {sizes}")


def local_kv_heads(config: PretrainedConfig, tensor_parallel_size: int) -> int:
    """The KV heads one rank holds (and caches)."""
    text = config.get_text_config()
    num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return num_kv_heads // tensor_parallel_size
