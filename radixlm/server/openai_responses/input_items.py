"""Responses input items -> chat messages, as chat's template path expects them.

Items: messages (role user / system / developer / assistant; content a string or input_text / output_text parts),
`function_call` (an assistant tool call), `function_call_output` (a tool message) and `reasoning` (the assistant's
reasoning_content). Consecutive assistant items that one reply would have produced in order (reasoning, then text,
then calls) become one assistant message, the message chat would have answered with, so a conversation continued
from a stored response renders exactly as its previous turn's prompt did, plus the reply. Every refusal is a
ValueError whose message starts with the offending item's path (`input.3.content.0.type ...`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.errors import ParamError
from radixlm.server.request_bodies import MAX_CONTENT_PARTS

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
# The stage of an assistant reply each item kind fills: an item at an earlier or the same stage (but calls, which
# come in parallel) starts the next assistant message.
_REASONING, _CONTENT, _CALLS = 0, 1, 2


def text_of_parts(parts: Any, path: str, allow_output: bool = True) -> str:
    """The text of a content list (parts joined by newlines, as chat joins text parts)."""
    if not isinstance(parts, list):
        raise ParamError(path, "must be a string or a list of input_text parts")
    if len(parts) > MAX_CONTENT_PARTS:
        raise ParamError(path, f"holds {len(parts)} content parts; the limit is {MAX_CONTENT_PARTS}")
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _MEDIA_PARTS:
            raise ParamError(f"{path}.{j}.type", f"{kind!r} is not supported: this server reads text only")
        if kind not in (_TEXT_PARTS if allow_output else ("input_text",)) or not isinstance(part.get("text"), str):
            raise ParamError(f"{path}.{j}", "must be {\"type\": \"input_text\", \"text\": \"...\"}")
        texts.append(part["text"])
    return "\n".join(texts)


def _text(value: Any, path: str) -> str:
    return value if isinstance(value, str) else text_of_parts(value, path)


def _string(item: dict[str, Any], key: str, path: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ParamError(f"{path}.{key}", "must be a string")
    return value


@dataclass
class _Assistant:
    """One assistant message being assembled from consecutive items."""

    origin: str
    stage: int = -1
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


@dataclass
class ChatMessages:
    """The chat messages, and for each the field a 400 about it should name (an input item's path)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    _assistant: _Assistant | None = None

    def add(self, message: dict[str, Any], origin: str) -> None:
        self.flush()
        self.messages.append(message)
        self.origins.append(origin)

    def assistant(self, stage: int, origin: str) -> _Assistant:
        """The assistant message an item of this stage belongs to (a new one if the current one is past it)."""
        current = self._assistant
        if current is None or stage < current.stage or (stage == current.stage and stage != _CALLS):
            self.flush()
            current = self._assistant = _Assistant(origin)
        current.stage = stage
        return current

    def flush(self) -> None:
        if self._assistant is not None:
            self.messages.append(self._assistant.message())
            self.origins.append(self._assistant.origin)
            self._assistant = None


def chat_messages(items: list[Any], origins: list[str]) -> ChatMessages:
    """The chat messages of `items`; `origins[i]` is item i's path in the request, for error messages."""
    out = ChatMessages()
    for item, path in zip(items, origins, strict=True):
        if not isinstance(item, dict):
            raise ParamError(path, "must be an object (an input item)")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            _message(out, item, path)
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", path), "type": "function",
                    "function": {"name": _string(item, "name", path), "arguments": _string(item, "arguments", path)}}
            out.assistant(_CALLS, path).tool_calls.append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else text_of_parts(output, f"{path}.output", False)
            out.add({"role": "tool", "tool_call_id": _string(item, "call_id", path), "content": content}, path)
        elif kind == "reasoning":
            out.assistant(_REASONING, path).reasoning = _reasoning_text(item, path)
        else:
            raise ParamError(f"{path}.type", f"{str(kind)[:64]!r} is not supported: input items are messages, "
                             f"function_call, function_call_output and reasoning")
    out.flush()
    return out


def _message(out: ChatMessages, item: dict[str, Any], path: str) -> None:
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        raise ParamError(f"{path}.role", f"must be one of {', '.join(_MESSAGE_ROLES)}")
    content = item.get("content")
    if role == "assistant":
        text = _text(content, f"{path}.content")
        out.assistant(_CONTENT, path).content = text
    elif isinstance(content, str):
        out.add({"role": role, "content": content}, path)
    else:
        out.add({"role": role, "content": text_of_parts(content, f"{path}.content", allow_output=False)}, path)


def _reasoning_text(item: dict[str, Any], path: str) -> str:
    if item.get("encrypted_content") is not None:
        raise ParamError(f"{path}.encrypted_content", "is not supported: this server neither makes nor reads it")
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if isinstance(parts, list) and len(parts) > MAX_CONTENT_PARTS:
            raise ParamError(f"{path}.{key}", f"holds {len(parts)} parts; the limit is {MAX_CONTENT_PARTS}")
        if not isinstance(parts, list) or not all(
                isinstance(p, dict) and p.get("type") == part_type and isinstance(p.get("text"), str) for p in parts):
            raise ParamError(f"{path}.{key}", f"must be a list of {{\"type\": \"{part_type}\", \"text\": \"...\"}}")
        if parts:
            return "\n".join(p["text"] for p in parts)
    return ""
