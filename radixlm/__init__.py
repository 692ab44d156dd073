"""radixlm: an SGLang-style LLM inference engine in readable Python."""

from radixlm.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from radixlm.engine.llm import LLM
from radixlm.engine.llm_engine import LLMEngine
from radixlm.engine.outputs import CompletionOutput, RequestOutput
from radixlm.sampling_params import SamplingParams

__all__ = ["LLM", "CacheConfig", "CompletionOutput", "EngineConfig", "LLMEngine", "ModelConfig", "RequestOutput",
           "SamplingParams", "SchedulerConfig"]
__version__ = "0.1.0"
