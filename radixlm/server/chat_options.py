"""ChatOptions: the server-wide chat flags (`--chat-template`, `--tool-call-parser`, `--enable-auto-tool-choice`,
`--reasoning-parser`), named as vLLM names them, validated once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.reasoning import ReasoningParser, get_reasoning_parser
from radixlm.server.chat_template import load_chat_template
from radixlm.tool_parsers import ToolParser, get_tool_parser

DEFAULT_TOOL_FORMAT = "hermes"  # forced tool choices use it when no --tool-call-parser is given


@dataclass(frozen=True)
class ChatOptions:
    chat_template: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    template_text: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "template_text", load_chat_template(self.chat_template))
        if self.tool_call_parser is not None:
            get_tool_parser(self.tool_call_parser)
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs --tool-call-parser")

    def tool_parser(self) -> ToolParser:
        """The parser that reads (and, for forced choices, shapes) tool calls."""
        return get_tool_parser(self.tool_call_parser or DEFAULT_TOOL_FORMAT)

    def reasoning(self) -> ReasoningParser | None:
        return get_reasoning_parser(self.reasoning_parser) if self.reasoning_parser is not None else None
