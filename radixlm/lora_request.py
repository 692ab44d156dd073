"""LoRARequest: the LoRA adapter a request runs with (vLLM's name and fields), plain data.

A request without one runs the base model. `lora_int_id` is the adapter's identity inside the engine: the prefix
cache keeps each adapter's K/V apart by it, the model worker finds the adapter's weights by it. Two loads of the
same name get different ids (an adapter unloaded and loaded again from another directory must not find the old
one's K/V). `lora_name` is what clients put in `model`; `lora_path` is a PEFT adapter directory
(`adapter_config.json` and `adapter_model.safetensors`).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.errors import ParamError

MAX_LORA_NAME_CHARS = 256


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, id (>= 1; 0 is the base model) and directory. Invalid values raise ValueError naming the
    field."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name.strip():
            raise ParamError("lora_name", f"must be a non-empty string, got {self.lora_name!r}")
        if len(self.lora_name) > MAX_LORA_NAME_CHARS:
            raise ParamError("lora_name", f"must be at most {MAX_LORA_NAME_CHARS} characters")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ParamError("lora_int_id", f"must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ParamError("lora_path", f"must be a non-empty string, got {self.lora_path!r}")


def lora_id_of(lora_request: LoRARequest | None) -> int:
    """The adapter id a request's K/V are kept under: 0 for the base model."""
    return 0 if lora_request is None else lora_request.lora_int_id
