"""The Messages API's reply: a `message` with content blocks, its stop reason and its usage, as Anthropic shapes it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from radixlm.outputs import CompletionOutput
from radixlm.server.prompt_result import PromptResult

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingContent(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # Anthropic signs its thinking so it can be checked when sent back; ours is not signed


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ResponseBlock = TextContent | ThinkingContent | ToolUseContent


class MessageUsage(BaseModel):
    """As Anthropic counts: `input_tokens` are the prompt tokens not read from the prefix cache, so the whole
    prompt is `input_tokens + cache_read_input_tokens` (what count_tokens returns)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int

    @classmethod
    def of(cls, result: PromptResult) -> MessageUsage:
        cached = result.num_cached_tokens
        return cls(input_tokens=len(result.prompt_token_ids) - cached, cache_read_input_tokens=cached,
                   output_tokens=sum(len(sequence.token_ids) for sequence in result.sequences.values()))


class Message(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ResponseBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


def message_id(request_id: str) -> str:
    """The message's id: the engine request's own hex (`msg-<hex>` in logs and traces) as `msg_<hex>`."""
    return f"msg_{request_id.removeprefix('msg-')}"


def stop_reason_of(sequence: CompletionOutput, num_tool_uses: int,
                   stop_sequences: tuple[str, ...]) -> tuple[StopReason, str | None]:
    """Why the reply ended, and the stop sequence that ended it. A length stop wins (a call cut short is not a
    finished call), then a stop sequence (the client asked to know which), then calls."""
    if sequence.finish_reason == "length":
        return "max_tokens", None
    if isinstance(sequence.stop_reason, str) and sequence.stop_reason in stop_sequences:
        return "stop_sequence", sequence.stop_reason
    if num_tool_uses:
        return "tool_use", None
    return "end_turn", None
