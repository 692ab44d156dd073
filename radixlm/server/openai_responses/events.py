"""One sequence's parsed deltas -> the response's output items, and the typed stream events that build them.

`OutputAssembler.feed` takes what chat's `SequenceParser` makes of each text delta (reasoning, content, tool-call
deltas) and returns the events: an item opens (`response.output_item.added`, for text items also
`response.content_part.added`), grows (`response.output_text.delta`, `response.reasoning_text.delta`,
`response.function_call_arguments.delta`) and closes (the `.done` events, then `response.output_item.done`) when
an item of another kind, or another call, begins, or at `finish`. A non-streamed response feeds the whole text at
once and keeps only the items, so both agree by construction (but for the random ids). Events are plain dicts
without `sequence_number`, which `sse_frame` adds as it frames them.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.sse import format_sse_event

from radixlm.server.openai_responses.items import FunctionCallItem, MessageItem, ReasoningItem, TextItem
from radixlm.server.response_bodies import DeltaMessage, DeltaToolCall

Event = dict[str, Any]
_TEXT_EVENTS = {"message": "response.output_text", "reasoning": "response.reasoning_text"}


class OutputAssembler:
    """The output items of one response, built delta by delta; at most the last item is open."""

    def __init__(self) -> None:
        self.items: list[MessageItem | ReasoningItem | FunctionCallItem] = []
        self._open: MessageItem | ReasoningItem | FunctionCallItem | None = None
        self._calls: dict[int, FunctionCallItem] = {}  # the parser's call index -> its item
        self._output_indexes: dict[str, int] = {}  # item id -> its place in `items`

    def feed(self, deltas: list[DeltaMessage]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.reasoning_content:
                events += self._text(ReasoningItem, delta.reasoning_content)
            if delta.content:
                events += self._text(MessageItem, delta.content)
            for call in delta.tool_calls or []:
                events += self._call(call)
        return events

    def finish(self, incomplete: bool) -> list[Event]:
        """Close the last item ("incomplete" if generation was cut off); a reply with nothing in it is one empty
        message, as OpenAI answers."""
        events = [] if self.items else self._open_item(MessageItem())
        return events + self._close(status="incomplete" if incomplete else "completed")

    @property
    def reasoning_text(self) -> str:
        return "".join(part.text for item in self.items if isinstance(item, ReasoningItem) for part in item.content)

    def _text(self, kind: type[TextItem], delta: str) -> list[Event]:
        events = [] if isinstance(self._open, kind) else self._close() + self._open_item(kind())
        item = self._open
        assert isinstance(item, kind)
        item.content[0].text += delta
        return [*events, {"type": f"{_TEXT_EVENTS[item.type]}.delta", **self._where(item), "content_index": 0,
                          "delta": delta, **({"logprobs": []} if item.type == "message" else {})}]

    def _call(self, delta: DeltaToolCall) -> list[Event]:
        events: list[Event] = []
        if delta.id is not None:  # a call's first delta: a new item
            item = FunctionCallItem(call_id=delta.id, name=delta.function.name or "")
            events = self._close() + self._open_item(item)
            self._calls[delta.index] = item
        item = self._calls[delta.index]
        arguments = delta.function.arguments or ""
        if arguments:
            item.arguments += arguments
            events.append({"type": "response.function_call_arguments.delta", **self._where(item), "delta": arguments})
        return events

    def _open_item(self, item: MessageItem | ReasoningItem | FunctionCallItem) -> list[Event]:
        self._output_indexes[item.id] = len(self.items)
        self.items.append(item)
        self._open = item
        events = [{"type": "response.output_item.added", "output_index": self._output_indexes[item.id],
                   "item": item.model_dump(mode="json")}]
        if not isinstance(item, FunctionCallItem):
            part = item.new_part()
            item.content.append(part)  # type: ignore[arg-type]  # the part matches its item
            events.append({"type": "response.content_part.added", **self._where(item), "content_index": 0,
                           "part": part.model_dump(mode="json")})
        return events

    def _close(self, status: str = "completed") -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = status  # type: ignore[assignment]  # "completed" | "incomplete"
        where = self._where(item)
        if isinstance(item, FunctionCallItem):
            events = [{"type": "response.function_call_arguments.done", **where, "name": item.name,
                       "arguments": item.arguments}]
        else:
            part = item.content[0]
            events = [{"type": f"{_TEXT_EVENTS[item.type]}.done", **where, "content_index": 0, "text": part.text,
                       **({"logprobs": []} if item.type == "message" else {})},
                      {"type": "response.content_part.done", **where, "content_index": 0,
                       "part": part.model_dump(mode="json")}]
        return [*events, {"type": "response.output_item.done", "output_index": where["output_index"],
                          "item": item.model_dump(mode="json")}]

    def _where(self, item: MessageItem | ReasoningItem | FunctionCallItem) -> Event:
        return {"item_id": item.id, "output_index": self._output_indexes[item.id]}


def sse_frame(event: Event, sequence_number: int) -> bytes:
    """`event: <type>` and `data: {json}`, the event carrying its `sequence_number`."""
    return format_sse_event(event=event["type"], data_str=json.dumps({**event, "sequence_number": sequence_number}))
