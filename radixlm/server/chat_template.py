"""Chat templating: `--chat-template` (a shipped name, a file, or inline Jinja), `chat_template_kwargs`, and the
conversation as transformers' `apply_chat_template` expects it (tools, assistant `tool_calls`, `tool` messages).

Shipped templates live in `radixlm/templates/` and are named by their file stem (`--chat-template smollm2_tools`).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from radixlm.errors import ParamError
from radixlm.server.errors import APIError
from radixlm.server.request_bodies import ChatMessage

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
MAX_TEMPLATE_KWARGS = 16
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# apply_chat_template's own parameters: a request must not reach them through chat_template_kwargs.
_RESERVED_KWARGS = frozenset({"conversation", "conversations", "messages", "sanitize_control_tokens", "tools",
                              "documents", "chat_template", "tokenize",
                              "add_generation_prompt", "continue_final_message", "padding", "truncation",
                              "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
                              "tokenizer_kwargs"})


def shipped_templates() -> list[str]:
    return sorted(path.stem for path in TEMPLATE_DIR.glob("*.jinja"))


def load_chat_template(value: str | None) -> str | None:
    """The template text for `--chat-template`: a shipped template's name, a file, or a Jinja string."""
    if value is None:
        return None
    if value in shipped_templates():
        return (TEMPLATE_DIR / f"{value}.jinja").read_text()
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    raise ValueError(f"chat_template {value!r} is neither a file, a shipped template ({', '.join(shipped_templates())})"
                     f" nor a Jinja template")


def check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    """`chat_template_kwargs` as template variables; ValueError names the field."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise ParamError("chat_template_kwargs", f"must be an object of at most {MAX_TEMPLATE_KWARGS} variables")
    odd = [key for key in kwargs if not _VARIABLE.fullmatch(key)]
    if odd:
        raise ParamError("chat_template_kwargs", f"key {odd[0][:64]!r} is not a template variable name")
    reserved = sorted(_RESERVED_KWARGS & set(kwargs))
    if reserved:
        raise ParamError("chat_template_kwargs", f"cannot set {reserved[0]!r} (a request field or the server's)")
    return kwargs


def _conversation_entry(i: int, message: ChatMessage) -> dict[str, Any]:
    entry: dict[str, Any] = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        for j, part in enumerate(message.content):
            if part.type != "text":
                raise APIError(400, f"content part type {part.type!r} is not supported (text only)",
                               param=f"messages.{i}.content.{j}.type")
            if part.text is None:
                raise APIError(400, "a text content part needs a text string", param=f"messages.{i}.content.{j}.text")
        entry["content"] = "\n".join(part.text or "" for part in message.content)
    entry.setdefault("content", "")
    if entry["role"] == "developer":  # OpenAI's new name for the system role; templates know "system"
        entry["role"] = "system"
    tool_calls = entry.get("tool_calls")
    if tool_calls is not None:
        entry["tool_calls"] = _template_tool_calls(i, tool_calls)
    return entry


def _template_tool_calls(i: int, tool_calls: Any) -> list[Any]:
    """OpenAI sends arguments as JSON text; templates (as transformers and vLLM pass them) get the object. Text
    that is not JSON (a call cut off by max_tokens, sent back as the client got it) reaches the template as the
    text itself, as vLLM lets it through: refusing it would end the client's conversation."""
    param = f"messages.{i}.tool_calls"
    if not isinstance(tool_calls, list):
        raise APIError(400, f"{param} must be a list", param=param)
    calls = []
    for j, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(400, f"{param}.{j} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                f"\"arguments\"}}}}", param=f"{param}.{j}")
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError, RecursionError):
                arguments = json.loads(arguments)
        calls.append(call | {"function": function | {"arguments": arguments}})
    return calls


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[ChatMessage], add_generation_prompt: bool,
                    tools: list[dict[str, Any]] | None = None, chat_template: str | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Render the conversation (the server's template, else the tokenizer's); template problems are a 400."""
    conversation = [_conversation_entry(i, message) for i, message in enumerate(messages)]
    try:
        text = tokenizer.apply_chat_template(conversation, tools=tools, chat_template=chat_template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **(template_kwargs or {}))
    except (TemplateError, ValueError, TypeError, KeyError) as error:
        raise APIError(400, f"the chat template rejected the messages: {error}", param="messages") from None
    return tokenizer.encode(text, add_special_tokens=False)
