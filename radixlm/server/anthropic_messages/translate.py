"""A Messages API body -> the ChatCompletionRequest that `ChatCompletions.start` runs, and its errors back.

The mapping, as vLLM and SGLang make it: `system` becomes a leading system message; `tool_use` blocks become the
assistant's `tool_calls` (arguments as JSON text), `thinking` blocks its `reasoning_content`; each `tool_result`
becomes a `tool` message (an `is_error` result reads "Error: ..."); `tools` become functions, `tool_choice` any ->
"required", tool -> the named function, `disable_parallel_tool_use` -> `parallel_tool_calls: false`;
`stop_sequences` -> `stop`; `metadata.user_id` -> `metadata`; `thinking` -> the template's `enable_thinking`
(with a reasoning parser). The chat request is validated as a chat body is, and the errors its checks raise name
the chat fields: `ChatTranslation.renamed` names the Anthropic field instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from radixlm.server.anthropic_messages.bodies import (
    ASSISTANT_BLOCKS,
    USER_BLOCKS,
    InputMessage,
    MessagesInput,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)
from radixlm.server.errors import APIError
from radixlm.server.request_bodies import ChatCompletionRequest

# Chat field paths -> Anthropic's (applied in order; `messages.N` is mapped through `ChatTranslation.sources`).
_FIELD_NAMES = ((re.compile(r"tools\.(\d+)\.function\.parameters"), r"tools.\1.input_schema"),
                (re.compile(r"tools\.(\d+)\.function\.name"), r"tools.\1.name"),
                (re.compile(r"stop\b"), "stop_sequences"),
                (re.compile(r"chat_template_kwargs"), "thinking"),
                (re.compile(r"parallel_tool_calls"), "tool_choice.disable_parallel_tool_use"))
_CHAT_MESSAGE = re.compile(r"messages\.(\d+)(\.[\w.]+)?")


@dataclass(frozen=True)
class ChatTranslation:
    """The chat request, and for each of its messages the Anthropic field it came from (`system`,
    `messages.3`), so that errors about chat messages name what the client sent."""

    request: ChatCompletionRequest
    sources: list[str]

    def renamed(self, error: APIError) -> APIError:
        """`error` (raised about the chat request) naming the Anthropic fields: its param, and its message's
        leading field name."""
        if error.param is None:
            return error
        param = self._anthropic_path(error.param)
        message = error.message
        if message.startswith(error.param):
            message = param + message[len(error.param):]
        return APIError(error.status, message, param=param, code=error.code)

    def _anthropic_path(self, path: str) -> str:
        match = _CHAT_MESSAGE.fullmatch(path)
        if match is not None:
            index = int(match.group(1))
            return self.sources[index] if index < len(self.sources) else "messages"
        for pattern, replacement in _FIELD_NAMES:
            if pattern.match(path):
                return pattern.sub(replacement, path, count=1)
        return path


def translate(body: MessagesInput, reasoning: bool) -> ChatTranslation:
    """The chat request for `body`; `reasoning`: the server runs a reasoning parser (`thinking` maps onto the
    template's `enable_thinking` only then). 400 for what chat cannot express (a final assistant message)."""
    messages, sources = _conversation(body)
    fields: dict[str, Any] = {"model": body.model, "messages": messages}
    if body.tools:  # an empty list is no tools, as Anthropic reads it (chat refuses an empty list)
        fields["tools"] = [{"type": "function", "function": {
            "name": tool.name, "parameters": tool.input_schema,
            **({"description": tool.description} if tool.description is not None else {})}} for tool in body.tools]
    if body.tool_choice is not None:
        fields["tool_choice"] = _chat_tool_choice(body.tool_choice)
        fields["parallel_tool_calls"] = not body.tool_choice.disable_parallel_tool_use
    thinking = _template_kwargs(body, reasoning)
    if thinking:
        fields["chat_template_kwargs"] = thinking
    if isinstance(body, MessagesRequest):
        fields |= _sampling_fields(body)
    try:
        request = ChatCompletionRequest.model_validate(fields)
    except ValidationError as error:  # the body was validated already: only a limit chat adds can trip here
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise APIError(400, f"the request does not translate to a chat request: {where}: {first['msg']}",
                       code=str(first["type"])) from None
    return ChatTranslation(request, sources)


def _sampling_fields(body: MessagesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_tokens": body.max_tokens}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            fields[name] = getattr(body, name)
    if body.stop_sequences:
        fields["stop"] = body.stop_sequences
    if body.metadata is not None and body.metadata.user_id is not None:
        fields["metadata"] = {"user_id": body.metadata.user_id}
    return fields


def _template_kwargs(body: MessagesInput, reasoning: bool) -> dict[str, Any]:
    if body.thinking is None:
        return {}
    if not reasoning:
        if body.thinking.type == "enabled":
            raise APIError(400, "thinking needs the server to run with --reasoning-parser", param="thinking")
        return {}  # nothing to turn off
    return {"enable_thinking": body.thinking.type == "enabled"}


def _chat_tool_choice(choice: ToolChoice) -> Any:
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _conversation(body: MessagesInput) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages and, for each, the Anthropic field it came from."""
    messages: list[dict[str, Any]] = []
    sources: list[str] = []
    if body.system and any(block.text for block in body.system):  # an empty system prompt is none
        messages.append({"role": "system", "content": _text_parts(body.system)})
        sources.append("system")
    last = len(body.messages) - 1
    for i, message in enumerate(body.messages):
        if message.role == "assistant" and i == last:
            raise APIError(400, f"messages.{i}: a final assistant message (prefill, to continue it) is not "
                                f"supported by this server; end with a user message", param=f"messages.{i}")
        converted = _assistant(i, message) if message.role == "assistant" else _user(i, message)
        messages.extend(converted)
        sources.extend([f"messages.{i}"] * len(converted))
    return messages, sources


def _check_roles(i: int, message: InputMessage, allowed: tuple[str, ...]) -> None:
    for j, block in enumerate(message.content):
        if block.type not in allowed:
            raise APIError(400, f"messages.{i}.content.{j}: {message.role} messages cannot hold {block.type} "
                                f"blocks", param=f"messages.{i}.content.{j}")


def _user(i: int, message: InputMessage) -> list[dict[str, Any]]:
    """Text blocks in a row make one user message; each tool_result a tool message, in the order sent."""
    _check_roles(i, message, USER_BLOCKS)
    messages: list[dict[str, Any]] = []
    texts: list[TextBlock] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            if texts:
                messages.append({"role": "user", "content": _text_parts(texts)})
                texts = []
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _tool_result_text(block)})
        elif isinstance(block, TextBlock):
            texts.append(block)
    if texts or not messages:
        messages.append({"role": "user", "content": _text_parts(texts)})
    return messages


def _assistant(i: int, message: InputMessage) -> list[dict[str, Any]]:
    _check_roles(i, message, ASSISTANT_BLOCKS)
    texts = [block for block in message.content if isinstance(block, TextBlock)]
    calls = [block for block in message.content if isinstance(block, ToolUseBlock)]
    reasoning = "".join(block.thinking for block in message.content if isinstance(block, ThinkingBlock))
    entry: dict[str, Any] = {"role": "assistant", "content": _text_parts(texts) if texts else None}
    if calls:
        entry["tool_calls"] = [{"id": call.id, "type": "function", "function": {
            "name": call.name, "arguments": json.dumps(call.input, ensure_ascii=False)}} for call in calls]
    if reasoning:
        entry["reasoning_content"] = reasoning
    return [entry]


def _text_parts(blocks: list[TextBlock]) -> list[dict[str, Any]] | str:
    """Chat's text parts (the template gets them joined by newlines); no blocks is an empty text."""
    return [{"type": "text", "text": block.text} for block in blocks] if blocks else ""


def _tool_result_text(block: ToolResultBlock) -> str:
    text = "\n".join(part.text for part in block.content)
    return f"Error: {text}" if block.is_error else text
