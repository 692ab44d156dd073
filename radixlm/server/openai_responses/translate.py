"""A Responses request -> the ChatCompletionRequest that runs it, and chat's 400s -> the Responses field they name.

Mapping: `instructions` -> a leading system message; the stored conversation (`previous_response_id`) then
`input` -> messages (`input_items.py`); `tools` (flat `{type, name, description, parameters, strict}`) -> chat's
`{"type": "function", "function": {...}}`; `tool_choice` `{"type": "function", "name"}` -> chat's named choice;
`text.format` -> `response_format`; `max_output_tokens` -> `max_completion_tokens`. The chat body is built with
`ChatCompletionRequest.model_validate`, so it is checked exactly as a chat request is. Every ValueError's message
starts with the Responses field it is about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from radixlm.errors import ParamError
from radixlm.server.errors import APIError
from radixlm.server.openai_responses.bodies import ResponsesRequest
from radixlm.server.openai_responses.input_items import chat_messages
from radixlm.server.request_bodies import ChatCompletionRequest

_FUNCTION_KEYS = ("name", "description", "parameters", "strict")
# Function-tool options with no meaning here: set, they are refused.
_FUNCTION_NEUTRAL = {"defer_loading": (None, False), "async": (None, False), "output_schema": (None,),
                     "allowed_callers": (None, ["direct"])}
_FORMATS = ("text", "json_object", "json_schema")
# Chat's field names (the leading part of a param) as the Responses API names them.
_RENAMED = {"response_format": "text.format", "max_completion_tokens": "max_output_tokens",
            "max_tokens": "max_output_tokens"}


@dataclass(frozen=True)
class ChatTranslation:
    """The chat request, the Responses field each of its messages came from, and this request's input as
    items (what the store keeps, after the previous response's conversation)."""

    body: ChatCompletionRequest
    origins: list[str]
    new_items: list[Any]


def input_as_items(value: str | list[Any]) -> list[Any]:
    """`input` as a list of items: a string is one user message."""
    return [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses' function tools in chat's shape; anything else (built-in tools) is refused by name."""
    converted = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise ParamError(f"tools.{i}.type", f"{str(kind)[:64]!r} is not supported: only function tools are "
                             f"(built-in tools such as web_search, file_search and code_interpreter run on OpenAI's "
                             f"servers)")
        for key, neutral in _FUNCTION_NEUTRAL.items():
            if tool.get(key) not in neutral:
                raise ParamError(f"tools.{i}.{key}", "is not supported by this server")
        converted.append({"type": "function",
                          "function": {key: tool[key] for key in _FUNCTION_KEYS if tool.get(key) is not None}})
    return converted


def echoed_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The tools as the Response object lists them."""
    return [{"type": "function", **{key: tool.get(key) for key in _FUNCTION_KEYS}} for tool in tools or []]


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    expected = 'must be "none", "auto", "required" or {"type": "function", "name": ...}'
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if not isinstance(choice, dict):
        raise ParamError("tool_choice", expected)
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise ParamError("tool_choice", f'{expected}; {str(choice.get("type"))[:64]!r} choices (built-in tools, '
                                        f'allowed_tools) are not supported')
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's response_format (None for plain text)."""
    if text is None:
        return None
    if text.get("verbosity") not in (None, "medium"):
        raise ParamError("text.verbosity", "is not supported: this server cannot steer how long answers are")
    text_format = text.get("format")
    if text_format is None:
        return None
    if not isinstance(text_format, dict) or text_format.get("type") not in _FORMATS:
        raise ParamError('text.format', 'must be {"type": "text" | "json_object" | "json_schema", ...}')
    if text_format["type"] == "text":
        return None
    if text_format["type"] == "json_object":
        return {"type": "json_object"}
    if not isinstance(text_format.get("name"), str):
        raise ParamError("text.format.name", "must be a string")
    if not isinstance(text_format.get("schema"), dict):
        raise ParamError("text.format.schema", "must be a JSON schema object")
    return {"type": "json_schema", "json_schema": {key: text_format[key] for key in
                                                   ("name", "schema", "strict", "description") if key in text_format}}


def check_reasoning(reasoning: dict[str, Any] | None) -> None:
    for key, value in (reasoning or {}).items():
        if value is not None:
            raise ParamError(f"reasoning.{str(key)[:64]}", "is not supported: reasoning models reason as their chat "
                             "template and --reasoning-parser have them")


def chat_request(request: ResponsesRequest, previous_items: list[dict[str, Any]]) -> ChatTranslation:
    """The chat request running `request` after the stored conversation `previous_items`; ValueError and APIError
    name the Responses field."""
    check_reasoning(request.reasoning)
    new_items = input_as_items(request.input)
    if not new_items and not previous_items:
        raise ParamError("input", "must hold at least one item")
    origins = ["previous_response_id"] * len(previous_items) + [f"input.{i}" for i in range(len(new_items))]
    converted = chat_messages([*previous_items, *new_items], origins)
    messages, message_origins = converted.messages, converted.origins
    if request.instructions is not None:  # OpenAI does not carry instructions over from a previous response
        messages, message_origins = [{"role": "system", "content": request.instructions}, *messages], \
            ["instructions", *message_origins]
    tools = chat_tools(request.tools) if request.tools else None  # OpenAI (and its SDKs) accept "tools": []
    tool_choice = chat_tool_choice(request.tool_choice)
    if tools is None and tool_choice in ("auto", "none"):
        tool_choice = None  # meaningful without tools to OpenAI, refused by chat
    values = {"model": request.model, "messages": messages, "max_completion_tokens": request.max_output_tokens,
              "temperature": request.temperature, "top_p": request.top_p, "tools": tools,
              "tool_choice": tool_choice, "parallel_tool_calls": request.parallel_tool_calls,
              "response_format": chat_response_format(request.text), "metadata": request.metadata,
              "user": request.user}
    try:
        body = ChatCompletionRequest.model_validate({key: value for key, value in values.items() if value is not None})
    except ValidationError as error:
        first = error.errors()[0]
        param = responses_param(".".join(str(part) for part in first["loc"]), message_origins)
        raise APIError(400, f"{param}: {first['msg']}", param=param) from None
    return ChatTranslation(body, message_origins, new_items)


def responses_param(param: str | None, origins: list[str]) -> str | None:
    """A chat field path as the Responses request names it (`messages.3.content` -> the input item it came
    from, `tools.0.function.name` -> `tools.0.name`, `response_format` -> `text.format`, ...)."""
    if param is None:
        return None
    parts = param.split(".")
    if parts[0] == "messages":
        index = int(parts[1]) if len(parts) > 1 and parts[1].isdecimal() else -1
        return origins[index] if 0 <= index < len(origins) else "input"
    if parts[0] == "tools" and len(parts) > 2 and parts[2] == "function":
        del parts[2]
    parts[0] = _RENAMED.get(parts[0], parts[0])
    return ".".join(parts)


def responses_error(error: APIError, origins: list[str]) -> APIError:
    """`error` (raised by the chat path) naming the Responses field, in its param and its message."""
    param = responses_param(error.param, origins)
    if param == error.param:
        return error
    message = error.message
    if error.param is not None and message.startswith(error.param):
        message = str(param) + message[len(error.param):]
    return APIError(error.status, message, param=param, code=error.code, type_=error.type)
