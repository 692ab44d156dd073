"""What tensor parallelism asks of a model: a tensor-parallel plan in transformers, and head counts it can split.

transformers shards the projections column-wise by output features; our attention and KV cache work on whole
heads, so every rank gets whole query heads (N must divide their count) and whole KV heads. When N divides the KV
head count each rank holds `num_kv_heads / N` of them (transformers' plan as it is). When N is a multiple of the KV
head count, transformers' plan cannot split them, so the k and v projections are loaded whole ("replicate") and
each rank keeps the one KV head its query heads read: ranks r with the same `r // (N / num_kv_heads)` hold the same
KV head (replicated), and each rank's KV cache holds one head. Other counts are refused with the sizes that work.
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

KV_PROJECTIONS = ("k_proj", "v_proj")


def _heads(config: PretrainedConfig) -> tuple[int, int, int]:
    """(attention heads, KV heads, head_dim) of the text model."""
    text = config.get_text_config()
    num_heads = text.num_attention_heads
    num_kv_heads = getattr(text, "num_key_value_heads", None) or num_heads
    return num_heads, num_kv_heads, getattr(text, "head_dim", None) or text.hidden_size // num_heads


def check_tensor_parallel(config: PretrainedConfig, tensor_parallel_size: int, quantization: str | None) -> None:
    """Raise ValueError unless `config`'s architecture can run on `tensor_parallel_size` ranks."""
    size = tensor_parallel_size
    text = config.get_text_config()
    architecture = (config.architectures or [config.model_type])[0]
    if not getattr(text, "base_model_tp_plan", None):
        raise ValueError(f"tensor_parallel_size {size}: {architecture} has no tensor-parallel plan in transformers "
                         f"(base_model_tp_plan), so it cannot be sharded; use --tensor-parallel-size 1")
    if quantization is not None:
        raise ValueError(f"quantization {quantization} does not support tensor_parallel_size > 1 (its int8 linears "
                         f"are not sharded by transformers' plan); drop one of them")
    num_heads, num_kv_heads, _ = _heads(config)
    if num_heads % size or (num_kv_heads % size and size % num_kv_heads):
        sizes = [n for n in range(1, num_heads + 1)
                 if num_heads % n == 0 and (num_kv_heads % n == 0 or n % num_kv_heads == 0)]
        raise ValueError(f"tensor_parallel_size {size} must divide {architecture}'s {num_heads} attention heads, "
                         f"and divide or be a multiple of its {num_kv_heads} KV heads (each rank holds whole "
                         f"heads); sizes that work: {sizes}")
    if num_kv_heads % size and not _kv_rules(config):
        raise ValueError(f"tensor_parallel_size {size} exceeds {architecture}'s {num_kv_heads} KV heads, and its "
                         f"plan has no k_proj/v_proj rules to replicate them; sizes that work divide {num_kv_heads}")


def local_kv_heads(config: PretrainedConfig, tensor_parallel_size: int) -> int:
    """The KV heads one rank holds (and caches): its share, or one replicated head."""
    _, num_kv_heads, _ = _heads(config)
    return max(1, num_kv_heads // tensor_parallel_size)


def _kv_rules(config: PretrainedConfig) -> list[str]:
    """The plan's k/v projection rules, named as the causal-LM model names them (`model.layers.*.self_attn.k_proj`)."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    prefix = getattr(model_class, "base_model_prefix", "") if model_class is not None else ""
    plan = getattr(config.get_text_config(), "base_model_tp_plan", None) or {}
    return [f"{prefix}.{key}" if prefix else key for key in plan if key.rpartition(".")[2] in KV_PROJECTIONS]


def plan_override(config: PretrainedConfig, tensor_parallel_size: int) -> dict[str, str] | None:
    """The tp_plan override for `DistributedConfig`: None (the architecture's plan), or k/v loaded whole when the
    KV heads must be replicated."""
    _, num_kv_heads, _ = _heads(config)
    if num_kv_heads % tensor_parallel_size == 0:
        return None
    return dict.fromkeys(_kv_rules(config), "replicate")


def keep_rank_kv_heads(model: nn.Module, config: PretrainedConfig, rank: int, tensor_parallel_size: int) -> None:
    """After a load with `plan_override`: cut each whole k/v projection to the one KV head this rank's query
    heads read (query head h reads KV head h // (heads / KV heads); rank r holds query heads r * heads / N ..)."""
    _, num_kv_heads, head_dim = _heads(config)
    if num_kv_heads % tensor_parallel_size == 0:
        return
    head = rank // (tensor_parallel_size // num_kv_heads)
    rows = slice(head * head_dim, (head + 1) * head_dim)
    for module in model.modules():
        if all(isinstance(getattr(module, name, None), nn.Linear) for name in KV_PROJECTIONS):
            for name in KV_PROJECTIONS:
                linear = getattr(module, name)
                linear.weight = nn.Parameter(linear.weight.data[rows].clone(), requires_grad=False)
                if linear.bias is not None:
                    linear.bias = nn.Parameter(linear.bias.data[rows].clone(), requires_grad=False)
                linear.out_features = head_dim
