"""The /v1/responses request body and the Response object, as pydantic models.

The request is checked like every other body (`RequestBody`: JSON types as sent, valid Unicode, bounded nesting,
list sizes counted before their entries are validated). Fields OpenAI defines that this server cannot honour are
declared so that `unsupported_field()` can name them: set to anything but their neutral value they are a 400, never
silently ignored. Unknown fields are ignored, as on every other endpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, StringConstraints

from radixlm.server.openai_responses.items import OutputItem
from radixlm.server.request_bodies import MAX_MESSAGES, RequestBody, is_off
from radixlm.server.tool_calling import MAX_TOOLS

MAX_INPUT_ITEMS = MAX_MESSAGES  # per request; a continuation's stored items count towards chat's own limit
MAX_INCLUDE = 16
MAX_RESPONSE_ID_CHARS = 128


def _one_of(*neutral: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or value in neutral


# Field -> "is this value one we can honour?". Accepted values mean what OpenAI says they mean.
_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "background": is_off,  # responses run while the request is open
    "conversation": is_off,  # use previous_response_id
    "prompt": is_off,  # stored prompt templates
    "include": is_off,  # no logprobs, encrypted reasoning or tool results to add
    "truncation": _one_of("disabled"),  # a too-long conversation is a 400
    "top_logprobs": _one_of(0),
    "max_tool_calls": is_off,  # built-in tools only
    "service_tier": _one_of("auto", "default"),
    "stream_options": lambda value: is_off(value) or value == {"include_obfuscation": False},
    "context_management": is_off,
    "prompt_cache_retention": _one_of("in_memory"),  # the radix cache is in memory, as long as it has room
    "prompt_cache_options": is_off,
    "moderation": is_off,
    "image": is_off,
    "background_options": is_off,
    "access_programs": is_off,
}


class ResponsesRequest(RequestBody):
    """POST /v1/responses. `input` items and `tools` are checked entry by entry in `translate.py`."""

    MAX_ENTRIES: ClassVar[dict[str, int]] = {"input": MAX_INPUT_ITEMS, "tools": MAX_TOOLS, "include": MAX_INCLUDE}
    UNSUPPORTED: ClassVar[dict[str, Callable[[Any], bool]]] = _UNSUPPORTED

    model: str | None = None
    input: str | list[Any]  # each item checked in input_items.py, naming its path
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    # OpenAI's metadata, as chat checks it: up to 16 string pairs (keys up to 64 characters, values up to 512).
    metadata: dict[Annotated[str, StringConstraints(max_length=64)],
                   Annotated[str, StringConstraints(max_length=512)]] | None = Field(None, max_length=16)
    user: str | None = None
    store: bool | None = None
    previous_response_id: str | None = Field(None, min_length=1, max_length=MAX_RESPONSE_ID_CHARS)
    stream: bool | None = None
    # Identifiers that only route or group requests: accepted, and they change nothing here.
    prompt_cache_key: str | None = Field(None, max_length=1024)
    safety_identifier: str | None = Field(None, max_length=1024)
    # Declared to be refused (see _UNSUPPORTED).
    background: Any = None
    conversation: Any = None
    prompt: Any = None
    include: Any = None
    truncation: Any = None
    top_logprobs: Any = None
    max_tool_calls: Any = None
    service_tier: Any = None
    stream_options: Any = None
    context_management: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    moderation: Any = None
    image: Any = None
    background_options: Any = None
    access_programs: Any = None

    @property
    def stores(self) -> bool:
        return self.store is not False  # OpenAI stores by default


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens the radix prefix cache already held
    cache_write_tokens: int = 0  # no explicit cache writes: every prompt is cached implicitly, at no cost


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int) -> ResponseUsage:
        return cls(input_tokens=input_tokens, input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
                   output_tokens=output_tokens,
                   output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
                   total_tokens=input_tokens + output_tokens)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseErrorBody(BaseModel):
    code: str
    message: str


ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class ResponseObject(BaseModel):
    """The Response object: what POST returns (or streams as it grows), GET returns and the store keeps."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus = "in_progress"
    error: ResponseErrorBody | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    store: bool = True
    temperature: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    background: bool = False
    service_tier: Literal["default"] = "default"
    top_logprobs: int = 0
