"""The output items of a response (message, reasoning, function_call) as the openai SDK's types parse them.

The same models serve the final response, the stream's `output_item.added` / `.done` snapshots and the store (a
continuation reads them back as input items, `input_items.py`).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

ItemStatus = Literal["in_progress", "completed", "incomplete"]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class MessageItem(BaseModel):
    """The assistant's text; `content` holds one output_text part once it has begun."""

    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: new_item_id("msg"))
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputText] = Field(default_factory=list)

    def new_part(self) -> OutputText:
        return OutputText()


class ReasoningItem(BaseModel):
    """What a `--reasoning-parser` split off as reasoning, as reasoning_text content (no summaries are made)."""

    type: Literal["reasoning"] = "reasoning"
    id: str = Field(default_factory=lambda: new_item_id("rs"))
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus = "in_progress"

    def new_part(self) -> ReasoningText:
        return ReasoningText()


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str = Field(default_factory=lambda: new_item_id("fc"))
    call_id: str
    name: str
    arguments: str = ""  # JSON text, as OpenAI sends it
    status: ItemStatus = "in_progress"


TextItem = MessageItem | ReasoningItem
OutputItem = Annotated[MessageItem | ReasoningItem | FunctionCallItem, Field(discriminator="type")]
