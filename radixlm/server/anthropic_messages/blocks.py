"""One reply's parsed deltas (reasoning, content, tool calls from `chat_output.SequenceParser`) -> Anthropic
content blocks: the stream events that build them, and the blocks themselves.

A whole reply is assembled from the same deltas (its text fed at once), so streaming and non-streaming replies
agree by construction, block for block. A change of kind (thinking -> text -> a call) closes the open block and
opens the next, in the order the model wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_core import from_json

from radixlm.server.anthropic_messages.events import StreamEvent, block_delta, block_start, block_stop
from radixlm.server.anthropic_messages.replies import ResponseBlock, TextContent, ThinkingContent, ToolUseContent
from radixlm.server.response_bodies import DeltaMessage, DeltaToolCall


@dataclass
class _Block:
    kind: str  # "text", "thinking" or "tool_use"
    text: str = ""  # the text, the thinking, or the tool input's JSON text
    call_id: str = ""
    name: str = ""

    def content(self) -> ResponseBlock:
        if self.kind == "text":
            return TextContent(text=self.text)
        if self.kind == "thinking":
            return ThinkingContent(thinking=self.text)
        return ToolUseContent(id=self.call_id, name=self.name, input=_tool_input(self.text))


def _tool_input(arguments: str) -> dict[str, object]:
    """The call's arguments as an object. A call cut short (max_tokens) has a JSON prefix: read it as the SDK reads a
    stream's partial JSON, keeping the complete values."""
    try:
        value = from_json(arguments or "{}", allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def tool_use_id(call_id: str) -> str:
    """Anthropic's id shape (`toolu_...`) for a call id of ours (`call_...`)."""
    return f"toolu_{call_id.removeprefix('call_')}"


class ContentAssembler:
    """`feed` each step's deltas and get the events that stream them; `finish` closes the last block; `blocks()`
    is the reply's content."""

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._open: int | None = None  # the index of the block that takes deltas
        self._call_blocks: dict[int, int] = {}  # tool call index -> its block's index

    @property
    def num_tool_uses(self) -> int:
        return len(self._call_blocks)

    def feed(self, deltas: list[DeltaMessage]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for delta in deltas:
            if delta.reasoning_content:
                events += self._append("thinking", "thinking_delta", delta.reasoning_content)
            if delta.content:
                events += self._append("text", "text_delta", delta.content)
            for call in delta.tool_calls or []:
                events += self._call(call)
        return events

    def finish(self) -> list[StreamEvent]:
        return self._close()

    def blocks(self) -> list[ResponseBlock]:
        return [block.content() for block in self._blocks]

    def _append(self, kind: str, delta_kind: str, text: str) -> list[StreamEvent]:
        events = [] if self._open is not None and self._blocks[self._open].kind == kind else self._start(_Block(kind))
        index = self._open
        assert index is not None
        self._blocks[index].text += text
        return [*events, block_delta(index, delta_kind, text)]

    def _call(self, call: DeltaToolCall) -> list[StreamEvent]:
        """A call's first delta (its id and name) opens its block; the argument fragments go to that block."""
        events = []
        if call.id is not None:
            events = self._start(_Block("tool_use", call_id=tool_use_id(call.id), name=call.function.name or ""))
            self._call_blocks[call.index] = len(self._blocks) - 1
        index = self._call_blocks.get(call.index)
        fragment = call.function.arguments or ""
        if index is None or not fragment:
            return events
        self._blocks[index].text += fragment
        return [*events, block_delta(index, "input_json_delta", fragment)]

    def _start(self, block: _Block) -> list[StreamEvent]:
        events = self._close()
        self._blocks.append(block)
        self._open = len(self._blocks) - 1
        opened = block.content() if block.kind != "tool_use" else ToolUseContent(id=block.call_id, name=block.name,
                                                                                  input={})
        return [*events, block_start(self._open, opened)]

    def _close(self) -> list[StreamEvent]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        return [block_stop(index)]
