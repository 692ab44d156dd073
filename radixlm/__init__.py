"""radixlm: an SGLang-style LLM inference engine in readable Python.

The public names are imported on first use, so that `import radixlm.core.scheduler` (pure Python) loads no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.cache_config import CacheConfig
    from radixlm.config import EngineConfig, ModelConfig, SchedulerConfig
    from radixlm.engine.llm_engine import LLMEngine
    from radixlm.llm import LLM
    from radixlm.outputs import CompletionOutput, RequestOutput
    from radixlm.pooling_params import PoolingParams
    from radixlm.sampling_params import SamplingParams

_EXPORTS = {"LLM": "radixlm.llm", "LLMEngine": "radixlm.engine.llm_engine",
            "CompletionOutput": "radixlm.outputs", "RequestOutput": "radixlm.outputs",
            "SamplingParams": "radixlm.sampling_params", "PoolingParams": "radixlm.pooling_params",
            "CacheConfig": "radixlm.cache_config",
            "EngineConfig": "radixlm.config", "ModelConfig": "radixlm.config", "SchedulerConfig": "radixlm.config"}

__all__ = ["LLM", "CacheConfig", "CompletionOutput", "EngineConfig", "LLMEngine", "ModelConfig", "PoolingParams",
           "RequestOutput", "SamplingParams", "SchedulerConfig"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
