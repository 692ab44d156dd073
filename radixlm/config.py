"""Engine configuration: frozen, validated dataclasses composed into `EngineConfig`.

Every field carries its help text in `metadata["help"]`; `radixlm.cli` turns the fields into command-line flags
named as vLLM and SGLang name them (`max_num_seqs` -> `--max-num-seqs`). Values are checked once in
`__post_init__` and never change afterwards: runtime counters live in the objects that own them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from radixlm.cache_config import CacheConfig
from radixlm.config_values import help_text as _help
from radixlm.config_values import parse_json_object
from radixlm.lora_config import LoRAConfig

SchedulePolicy = Literal["fcfs", "priority", "lpm"]
SCHEDULE_POLICIES: tuple[str, ...] = ("fcfs", "priority", "lpm")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "cpp", "torch")
DEFAULT_MODEL = "SmolLM2-135M-Instruct"
QUANTIZATION_METHODS: tuple[str, ...] = ("int8", "gguf", "q4_0", "q4_1", "q8_0")
EXECUTOR_BACKENDS: tuple[str, ...] = ("uni", "mp")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
POOLING_TYPES: tuple[str, ...] = ("last", "mean")
MAX_SPECULATIVE_TOKENS = 16

@dataclass(frozen=True)
class ModelConfig:
    model: str = field(default=DEFAULT_MODEL, metadata=_help(
        "local HF model directory, a .gguf file (read in place), or the default model name"))
    dtype: str = field(default="auto", metadata=_help(
        "weights and KV cache dtype: float32, bfloat16, float16, or auto (bfloat16 on CUDA, float32 on CPU)"))
    max_model_len: int | None = field(default=None, metadata=_help(
        "longest prompt + output in tokens (default: the model's maximum, capped by the KV cache capacity)"))
    seed: int = field(default=0, metadata=_help("engine seed: makes runs of unseeded requests reproducible"))
    served_model_name: str | None = field(default=None, metadata=_help("model name reported by the API"))
    num_threads: int | None = field(default=None, metadata=_help("torch intra-op threads (default: torch's)"))
    quantization: str | None = field(default=None, metadata=_help(
        "weight quantization: int8 (every linear, LM head included: int8 per-channel weights, per-token int8 "
        "activations); gguf (a .gguf model's linears and embedding served in the file's own blocks: Q8_0, Q4_0, "
        "Q4_1, Q4_K, Q6_K); q4_0, q4_1, q8_0 (any checkpoint's linears and embedding quantized at load to that GGUF "
        "block format: 4-bit with a scale per 32 weights, 4-bit with a scale and a minimum per 32, 8-bit). The GGUF "
        "formats multiply int8 activations, quantized per 32 values, and run with --dtype float32 or bfloat16 (the "
        "activations, norms, attention and KV cache in that dtype); int8 needs float32. All need --device cpu"))
    attention_backend: str = field(default="auto", metadata=_help(
        "decode attention: cpp (the C++ paged kernel), torch (reference) or auto (cpp when built, else torch)"))
    distributed_executor_backend: str = field(default="uni", metadata=_help(
        "where the model worker runs: uni (in the engine's process) or mp (a child process fed pickled steps)"))
    device: str = field(default="auto", metadata=_help(
        "where weights, KV cache and step tensors live: cpu, cuda, or auto (cuda when available)"))
    pooling: str = field(default="last", metadata=_help(
        "how /v1/embeddings and LLM.embed pool the final hidden states (after the final norm) of a prompt before "
        "L2-normalizing them: last (the last token's state, as vLLM does for decoder-only models) or mean (the "
        "mean over every prompt token; such requests skip the prefix cache)"))

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_TYPES:
            raise ValueError(f"pooling must be one of {POOLING_TYPES}, got {self.pooling!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.distributed_executor_backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend must be one of {EXECUTOR_BACKENDS}, "
                             f"got {self.distributed_executor_backend!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.quantization is not None:
            if self.quantization not in QUANTIZATION_METHODS:
                raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_METHODS)}, "
                                 f"got {self.quantization!r}")
            allowed = ("auto", "float32") if self.quantization == "int8" else ("auto", "float32", "bfloat16")
            if self.dtype not in allowed:
                raise ValueError(f"quantization {self.quantization} needs dtype {' or '.join(allowed[1:])}, "
                                 f"got {self.dtype!r}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """`--speculative-config` (vLLM's keys): n-gram drafts ("prompt lookup") of up to `num_speculative_tokens`
    tokens, continuing the most recent earlier occurrence of the longest n-gram (prompt_lookup_max down to
    prompt_lookup_min tokens) that ends the sequence."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 5
    prompt_lookup_min: int = 2

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative_config.method must be 'ngram', got {self.method!r}")
        for name, low, high in (("num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS), ("prompt_lookup_max", 1, 64),
                                ("prompt_lookup_min", 1, 64)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"speculative_config.{name} must be an integer in [{low}, {high}], got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) exceeds "
                             f"prompt_lookup_max ({self.prompt_lookup_max})")

    @classmethod
    def parse(cls, value: str | dict[str, object]) -> SpeculativeConfig:
        """From JSON text or a dict; unknown keys raise ValueError naming them. A lone prompt_lookup bound is
        used for both (as vLLM does)."""
        value = parse_json_object(value, "speculative_config")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"speculative_config has no key {sorted(unknown)[0]!r}")
        values = dict(value)
        given_max, given_min = values.get("prompt_lookup_max"), values.get("prompt_lookup_min")
        if type(given_max) is int and given_min is None:
            values["prompt_lookup_min"] = min(given_max, cls.prompt_lookup_min)
        if type(given_min) is int and given_max is None:
            values["prompt_lookup_max"] = max(given_min, cls.prompt_lookup_max)
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=128, metadata=_help("most sequences running at once (n > 1 takes n)"))
    max_num_batched_tokens: int = field(default=2048, metadata=_help(
        "token budget of one step: decodes take one each, prefill chunks share the rest"))
    schedule_policy: str = field(default="fcfs", metadata=_help(
        "order of waiting requests: fcfs, priority (lower value first) or lpm (longest cached prefix first)"))
    lpm_fallback_queue_len: int = field(default=128, metadata=_help(
        "lpm falls back to fcfs when more requests than this are waiting"))
    max_queued_requests: int | None = field(default=None, metadata=_help(
        "waiting requests beyond this are refused (HTTP 429; a request with more prompts than this: 400)"))
    trace: str | None = field(default=None, metadata=_help(
        "write one JSON line per arrival, step and finish to this file (radixlm replay / trace read it)"))
    max_sequences_per_request: int = field(default=64, metadata=_help(
        "most sequences one request may ask for (n, best_of); also capped by --max-num-seqs"))
    max_prompts_per_request: int = field(default=64, metadata=_help(
        "most prompts one /v1/completions request may hold (each is a request of its own, queued ahead of later "
        "arrivals); also capped by --max-queued-requests. Offline generate takes any number"))
    speculative_config: str | dict[str, object] | None = field(default=None, metadata=_help(
        'speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, '
        '"prompt_lookup_min": 2} (n-gram drafts from the sequence itself, verified exactly in the batch)'))

    @property
    def prompts_per_request_limit(self) -> tuple[int, str]:
        """The most prompts one request may hold, and the flag that sets it."""
        if self.max_queued_requests is not None and self.max_queued_requests < self.max_prompts_per_request:
            return self.max_queued_requests, "--max-queued-requests"
        return self.max_prompts_per_request, "--max-prompts-per-request"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        if self.lpm_fallback_queue_len < 0:
            raise ValueError(f"lpm_fallback_queue_len must be >= 0, got {self.lpm_fallback_queue_len}")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.max_sequences_per_request < 1:
            raise ValueError(f"max_sequences_per_request must be >= 1, got {self.max_sequences_per_request}")
        if self.max_prompts_per_request < 1:
            raise ValueError(f"max_prompts_per_request must be >= 1, got {self.max_prompts_per_request}")
        if self.speculative_config is not None:
            SpeculativeConfig.parse(self.speculative_config)

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The parsed `speculative_config`, or None when speculation is off."""
        return None if self.speculative_config is None else SpeculativeConfig.parse(self.speculative_config)


@dataclass(frozen=True)
class ParallelConfig:
    """Processes and machines: tensor parallelism inside an engine, data parallelism across engine replicas."""

    tensor_parallel_size: int = field(default=1, metadata=_help(
        "worker processes that shard the model (torch.distributed: gloo on CPU, NCCL on CUDA)"))
    data_parallel_size: int = field(default=1, metadata=_help(
        "engine replicas behind one server, with a cache-aware router"))
    nnodes: int = field(default=1, metadata=_help("machines the tensor-parallel ranks are spread over"))
    node_rank: int = field(default=0, metadata=_help("this machine's index among --nnodes (0 runs the server)"))
    dist_init_addr: str | None = field(default=None, metadata=_help(
        "host:port of node 0's rendezvous for torch.distributed (default: a free local port; needed if nnodes > 1)"))

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "data_parallel_size", "nnodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 64:
                raise ValueError(f"{name} must be an integer in [1, 64], got {value!r}")
        if not isinstance(self.node_rank, int) or isinstance(self.node_rank, bool) or \
                not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, nnodes), got {self.node_rank} with nnodes {self.nnodes}")
        if self.tensor_parallel_size % self.nnodes:
            raise ValueError(f"tensor_parallel_size ({self.tensor_parallel_size}) must be a multiple of "
                             f"nnodes ({self.nnodes})")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ValueError("dist_init_addr (host:port) is needed when nnodes > 1")
        if self.data_parallel_size > 1 and self.dist_init_addr is not None:
            raise ValueError("dist_init_addr is for one tensor-parallel group; with data_parallel_size > 1 every "
                             "replica's group finds its own free local port (leave it unset, and nnodes 1)")
        if self.dist_init_addr is not None:
            if not isinstance(self.dist_init_addr, str) or not self.dist_init_addr.isascii():
                raise ValueError(f"dist_init_addr must be host:port, got {self.dist_init_addr!r}")
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"dist_init_addr must be host:port, got {self.dist_init_addr!r}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine is built from; `EngineConfig.from_kwargs(model=..., max_num_seqs=...)` is handy."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        if self.lora.enabled and self.parallel.tensor_parallel_size > 1:
            raise ValueError("LoRA adapters are not served under tensor parallelism (tensor_parallel_size > 1)")
        if self.cache.kv_offload_dir is not None and (self.parallel.tensor_parallel_size > 1 or
                                                     self.parallel.data_parallel_size > 1):
            raise ValueError("kv_offload_dir is served by one engine and one worker: not with tensor_parallel_size "
                             "or data_parallel_size > 1")

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> EngineConfig:
        """Build from flat keyword arguments; an unknown name raises ValueError naming it."""
        parts: dict[str, dict[str, object]] = {"model": {}, "cache": {}, "scheduler": {}, "parallel": {}, "lora": {}}
        owners = {name: part for part, sub in (("model", ModelConfig), ("cache", CacheConfig),
                                                ("scheduler", SchedulerConfig), ("parallel", ParallelConfig),
                                                ("lora", LoRAConfig))
                  for name in sub.__dataclass_fields__}
        for name, value in kwargs.items():
            if name not in owners:
                raise ValueError(f"unknown engine option {name!r}")
            parts[owners[name]][name] = value
        return cls(ModelConfig(**parts["model"]), CacheConfig(**parts["cache"]),  # type: ignore[arg-type]
                   SchedulerConfig(**parts["scheduler"]), ParallelConfig(**parts["parallel"]),  # type: ignore[arg-type]
                   LoRAConfig(**parts["lora"]))  # type: ignore[arg-type]
