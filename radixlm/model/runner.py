"""ModelRunner: runs one packed forward per step over the paged KV cache and returns the logits to sample."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PretrainedConfig, PreTrainedModel

from radixlm.background_threads import release_free_memory
from radixlm.cache_config import CacheConfig
from radixlm.config import ModelConfig
from radixlm.config_values import parse_memory
from radixlm.core.step import ScheduledChunk
from radixlm.model.attention import create_backend, register_paged_attention, resolve_backend
from radixlm.model.collectives import agree_min
from radixlm.model.decode_stack import DecodeStack
from radixlm.model.device import keep_freed_host_memory, resolve_device, resolve_dtype
from radixlm.model.disk_kv_store import DiskKVStore
from radixlm.model.host_kv_cache import HEADROOM, HostKVCache
from radixlm.model.input_batch import InputBatch
from radixlm.model.kv_cache import PagedKVCache, kv_bytes_per_token, num_blocks_for_budget
from radixlm.model.loader import load_model
from radixlm.model.lora.adapters import LoRAAdapters
from radixlm.model.model_identity import block_file_directory, model_identity
from radixlm.model.pooling import final_hidden_states, pool_chunks
from radixlm.model.sharding import local_kv_heads

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only model that size its KV cache."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None
    hidden_size: int  # the length of an embedding (the final hidden state)

    @classmethod
    def from_config(cls, config: PretrainedConfig, tensor_parallel_size: int = 1) -> ModelShape:
        """The shape one rank sees: its share of the KV heads under tensor parallelism."""
        text = config.get_text_config()
        num_heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_heads
        return cls(num_layers=text.num_hidden_layers,
                   num_kv_heads=local_kv_heads(config, tensor_parallel_size),
                   head_dim=head_dim, vocab_size=text.vocab_size,
                   max_position_embeddings=getattr(text, "max_position_embeddings", None),
                   hidden_size=text.hidden_size)


@dataclass
class ForwardOutput:
    """float32 logits: the sampled rows (the last `num_sampled` positions of each chunk, chunk by chunk), and the
    prompt positions asked for (request id -> `[end - first, vocab]`, row j being position `first + j`); the
    pooled final hidden states asked for (request id -> `[hidden]` float32: see `radixlm.model.pooling`)."""

    logits: torch.Tensor
    prompt_logits: dict[str, torch.Tensor] = field(default_factory=dict)
    pooled: dict[str, torch.Tensor] = field(default_factory=dict)


class ModelRunner:
    """Owns the model and its paged KV cache; `execute` turns a step's chunks into logits."""

    def __init__(self, model_dir: Path, model_config: ModelConfig, cache_config: CacheConfig,
                 tensor_parallel_size: int = 1, enable_lora: bool = False) -> None:
        """`tensor_parallel_size` > 1: this process is one rank of a joined group (`worker/tensor_parallel/`); it
        loads its shard of the weights and caches its own KV heads, in as many blocks as every rank can hold.
        `enable_lora`: the projections take LoRA adapters (`self.lora`)."""
        if model_config.num_threads is not None:
            torch.set_num_threads(model_config.num_threads)
        self.device = resolve_device(model_config.device)
        self.dtype = resolve_dtype(model_config.dtype, self.device)
        if model_config.quantization is not None and self.device.type != "cpu":
            raise ValueError(f"quantization {model_config.quantization} runs on the CPU only, got device "
                             f"{self.device.type}")
        self.attention_backend = create_backend(_attention_backend(model_config, self.device))
        kv_dtype = self.dtype if cache_config.kv_cache_dtype == "auto" else getattr(torch, cache_config.kv_cache_dtype)
        # --attention-backend torch is the all-PyTorch reference: no C++ linears either.
        self.model: PreTrainedModel = load_model(model_dir, self.dtype, register_paged_attention(),
                                                 model_config.quantization,
                                                 small_batch_kernels=self.attention_backend.runs_cpp_kernels,
                                                 device=self.device, tensor_parallel_size=tensor_parallel_size)
        # Loading's freed buffers go back to the system (the default model: about 420 MB of RSS) before the KV cache
        # is sized from the free memory and allocated, and before the heap starts keeping what a step frees.
        release_free_memory()
        self.shape = ModelShape.from_config(self.model.config, tensor_parallel_size)
        self.lora = LoRAAdapters(self.model) if enable_lora else None
        # Decode steps run every layer in one C++ call where the model allows it (see radixlm.model.decode_stack).
        self.decode_stack = DecodeStack.build(self.model) if not enable_lora and tensor_parallel_size == 1 else None
        bytes_per_token = kv_bytes_per_token(self.shape.num_layers, self.shape.num_kv_heads, self.shape.head_dim,
                                             kv_dtype)
        num_blocks = agree_min(cache_config.num_kv_blocks or num_blocks_for_budget(
            cache_config.kv_cache_memory, bytes_per_token * cache_config.block_size, self.device))
        self.kv_cache = PagedKVCache(self.shape.num_layers, num_blocks, cache_config.block_size,
                                     self.shape.num_kv_heads, self.shape.head_dim, kv_dtype, self.device)
        self.host_kv: HostKVCache | None = None  # the host tier under the radix tree (--kv-offload-memory)
        if cache_config.kv_offload_memory != 0 and cache_config.enable_prefix_caching:
            budget = parse_memory(cache_config.kv_offload_memory, "kv_offload_memory")
            if budget <= 1.0:  # a fraction of the free memory, which every rank of this machine reads alike
                budget = min(budget * HEADROOM, 1.0) / tensor_parallel_size
            num_host_blocks = agree_min(num_blocks_for_budget(budget, bytes_per_token * cache_config.block_size))
            disk = None
            if cache_config.kv_offload_dir is not None:
                identity = model_identity(model_dir, model_config, cache_config)
                disk = DiskKVStore(block_file_directory(cache_config, identity), identity, self.kv_cache.tensors(),
                                   cache_config.block_size)
            self.host_kv = HostKVCache(self.kv_cache, num_host_blocks, disk)
        keep_freed_host_memory()

    @torch.inference_mode()
    def execute(self, chunks: Sequence[ScheduledChunk], block_tables: Mapping[str, list[int]],
                prompt_logits_positions: Mapping[str, tuple[int, int]] | None = None,
                pooling_types: Mapping[str, str] | None = None,
                lora_ids: Mapping[str, int] | None = None) -> ForwardOutput:
        """Compute the chunks (their requests' K/V live in `block_tables[request_id]`); return the logits of the
        sampled rows and of the prompt positions asked for (`prompt_logits_positions[request_id] = (first, end)`,
        within that request's chunk), and the final hidden states of the chunks of `pooling_types`' requests
        reduced as it says ("last" or "mean", see `radixlm.model.pooling.reduce_chunk`). `lora_ids[request_id]`: the
        LoRA adapter an adapted request runs with (loaded in `self.lora`)."""
        batch = InputBatch.build(chunks, block_tables, self.kv_cache, prompt_logits_positions, self.attention_backend,
                                 lora_ids)
        if batch.lora_groups and self.lora is None:
            raise RuntimeError("a request runs a LoRA adapter, but this model was loaded without LoRA support")
        if self.decode_stack is not None and not pooling_types and self.decode_stack.runs(batch):
            logits, pooled = self.decode_stack.logits(batch), {}
        else:
            with final_hidden_states(self.model, capture=bool(pooling_types)) as hidden, \
                    self.lora.rows(batch.lora_groups) if self.lora is not None else nullcontext():
                logits = self.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                                    logits_to_keep=batch.logits_indices, radix_attn=batch.attn_metadata).logits
            pooled = pool_chunks(chunks, batch.first_rows, hidden[0][0], pooling_types) if pooling_types else {}
        # The sampler runs on the host: its per-request streams and masks are host tensors (one copy per step).
        logits = logits[0].float().cpu()
        sampled = batch.num_sampled_rows
        return ForwardOutput(logits[:sampled], {request_id: logits[sampled:][rows]
                                               for request_id, rows in batch.extra_rows.items()}, pooled)


def _attention_backend(model_config: ModelConfig, device: torch.device) -> str:
    """The attention backend's name for this config on `device` (`radixlm.model.attention.resolve_backend`). The C++
    kernels and int8 (fbgemm) are CPU code: elsewhere PyTorch's SDPA path runs and int8 is refused."""
    if device.type != "cpu" and model_config.quantization is not None:
        raise ValueError(f"quantization {model_config.quantization} runs on CPU only (PyTorch's fbgemm kernel); "
                         f"drop --quantization or use --device cpu")
    return resolve_backend(model_config.attention_backend, device)
