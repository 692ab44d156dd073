"""Anthropic Messages API request bodies (`/v1/messages`, `/v1/messages/count_tokens`) as pydantic models.

Types are checked as sent (strict, as every request body here) and unknown fields are ignored, as Anthropic's API
ignores them. `content` and `system` may be a string or a list of blocks; a string is read as one text block.
A block type this server does not handle (image, document, redacted_thinking, server tool blocks, ...) and a
server tool (web_search, bash, ...) are refused with 400 naming where they are, rather than dropped. Fields that
ask for what this server does not offer (`container`, `mcp_servers`, ...) are declared so that
`unsupported_field()` can name them. `cache_control` marks are accepted and have no effect: the radix cache
reuses every shared prefix without being asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

from radixlm.sampling_params import MAX_STOP_STRINGS
from radixlm.server.request_bodies import MAX_CONTENT_PARTS, MAX_MESSAGES, RequestBody
from radixlm.server.tool_calling import MAX_TOOLS

MAX_ID_CHARS = 256  # tool_use ids and tool_result references
MAX_NAME_CHARS = 128  # tool names (check_tools then applies the 64-character rule to `tools`)
MIN_THINKING_BUDGET = 1024  # Anthropic's own minimum for `thinking.budget_tokens`
USER_BLOCKS = ("text", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking")

Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def as_blocks(value: Any, allowed: tuple[str, ...], what: str) -> Any:
    """A string as one text block; a list checked for its length and block types (400 naming the block)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        return value  # pydantic names the wrong type
    if len(value) > MAX_CONTENT_PARTS:
        raise PydanticCustomError("too_many_blocks", "holds {count} blocks; the limit is {limit}",
                                  {"count": len(value), "limit": MAX_CONTENT_PARTS})
    for i, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind not in allowed:
            raise PydanticCustomError("unsupported_block", "block {index} has type {kind}, which {what} cannot "
                                      "hold on this server (it takes {allowed})",
                                      {"index": i, "kind": repr(kind[:64]), "what": what,
                                       "allowed": ", ".join(allowed)})
    return value


class TextBlock(_Part):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Part):
    type: Literal["tool_use"]
    id: Id
    name: Name
    input: dict[str, Any]


class ToolResultBlock(_Part):
    type: Literal["tool_result"]
    tool_use_id: Id
    content: list[TextBlock] = Field(default_factory=list)
    is_error: bool = False

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        return as_blocks(value, ("text",), "a tool_result's content")


class ThinkingBlock(_Part):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # ours are empty: nothing to verify


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class InputMessage(_Part):
    role: Literal["user", "assistant"]
    content: list[ContentBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, value: Any) -> Any:
        return as_blocks(value, (*USER_BLOCKS, "tool_use", "thinking"), "a message")


class Tool(_Part):
    """A client tool; Anthropic's server tools (web_search, bash, code_execution, ...) are refused."""

    type: Literal["custom"] | None = None
    name: Name
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Part):
    type: Literal["auto", "any", "tool", "none"]
    name: Name | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named_when_tool(self) -> ToolChoice:
        if self.type == "tool" and self.name is None:
            raise PydanticCustomError("missing_name", 'a tool_choice of type "tool" needs the tool\'s name')
        return self


class ThinkingConfig(_Part):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(None, ge=MIN_THINKING_BUDGET)


class Metadata(_Part):
    user_id: Annotated[str, StringConstraints(max_length=256)] | None = None


def _server_tools_refused(tools: Any) -> Any:
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            raise PydanticCustomError("unsupported_tool", "tool {index} is a server tool ({kind}); this server "
                                      "runs only client tools (name, description, input_schema)",
                                      {"index": i, "kind": repr(str(kind)[:64])})
    return tools


def _is_off(value: Any) -> bool:
    return value is None or value == [] or value == {}


class MessagesInput(RequestBody):
    """What a prompt is made of: the fields `/v1/messages/count_tokens` takes (and `/v1/messages` with them)."""

    UNSUPPORTED: ClassVar[dict[str, Callable[[Any], bool]]] = {
        "container": _is_off, "mcp_servers": _is_off, "output_config": _is_off, "context_management": _is_off}
    MAX_ENTRIES: ClassVar[dict[str, int]] = {"messages": MAX_MESSAGES, "tools": MAX_TOOLS}

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    container: Any = None
    mcp_servers: Any = None
    output_config: Any = None
    context_management: Any = None

    @field_validator("system", mode="before")
    @classmethod
    def _system_blocks(cls, value: Any) -> Any:
        return as_blocks(value, ("text",), "system") if value is not None else None

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools(cls, value: Any) -> Any:
        return _server_tools_refused(value)

    def unsupported_field(self) -> str | None:
        """The first field set to something this server cannot honour, or None."""
        return next((name for name, is_off in self.UNSUPPORTED.items() if not is_off(getattr(self, name))), None)


class MessagesRequest(MessagesInput):
    """POST /v1/messages: `max_tokens` is required, as Anthropic requires it."""

    MAX_ENTRIES: ClassVar[dict[str, int]] = {**MessagesInput.MAX_ENTRIES, "stop_sequences": MAX_STOP_STRINGS}

    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    stream: bool = False

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> MessagesRequest:
        thinking = self.thinking
        if thinking is not None and thinking.type == "enabled":
            if thinking.budget_tokens is None:
                raise PydanticCustomError("missing_budget", 'thinking of type "enabled" needs budget_tokens')
            if thinking.budget_tokens >= self.max_tokens:
                raise PydanticCustomError("budget_too_large", "thinking.budget_tokens must be less than max_tokens")
        return self
