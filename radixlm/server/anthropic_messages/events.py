"""The Messages API's stream: named server-sent events (`event: <type>` then `data: {json}`), as Anthropic sends
them and its SDKs parse them.

A reply streams as `message_start`, `ping`, then per content block `content_block_start`, its
`content_block_delta`s (`text_delta`, `thinking_delta`, `input_json_delta`) and `content_block_stop`, then
`message_delta` (stop reason, usage) and `message_stop`. A failure mid-stream ends it with an `error` event carrying
Anthropic's error body.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.sse import format_sse_event
from pydantic import BaseModel

from radixlm.engine.async_engine import EngineUnavailableError
from radixlm.engine.output_stream import OutputStream
from radixlm.server.anthropic_messages.replies import Message, MessageUsage, StopReason
from radixlm.server.errors import APIError, anthropic_error_body

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEvent:
    """One event: its type (the `event:` line, repeated as `type` in its data, as Anthropic does) and data."""

    type: str
    data: dict[str, Any]

    def frame(self) -> str:
        return format_sse_event(event=self.type, data_str=json.dumps({"type": self.type, **self.data})).decode()


def message_start(message: Message) -> StreamEvent:
    """The reply's id, model and input usage, with no content and no stop reason yet."""
    return StreamEvent("message_start", {"message": message.model_dump(mode="json")})


def ping() -> StreamEvent:
    """Anthropic sends one after message_start; clients skip it."""
    return StreamEvent("ping", {})


def block_start(index: int, block: BaseModel) -> StreamEvent:
    """Opens block `index` with its empty form (`text: ""`, a tool_use's `input: {}`)."""
    return StreamEvent("content_block_start", {"index": index, "content_block": block.model_dump(mode="json")})


def block_delta(index: int, kind: str, value: str) -> StreamEvent:
    """`kind` is the delta's type: text_delta, thinking_delta or input_json_delta."""
    field = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}[kind]
    return StreamEvent("content_block_delta", {"index": index, "delta": {"type": kind, field: value}})


def block_stop(index: int) -> StreamEvent:
    """Block `index` is complete."""
    return StreamEvent("content_block_stop", {"index": index})


def message_delta(stop_reason: StopReason, stop_sequence: str | None, usage: MessageUsage) -> StreamEvent:
    """The end of the reply; usage counts are totals, as the SDK reads them (they replace message_start's)."""
    return StreamEvent("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                         "usage": usage.model_dump(mode="json")})


def message_stop() -> StreamEvent:
    """The last event of a reply that finished."""
    return StreamEvent("message_stop", {})


def error_event(error: APIError) -> StreamEvent:
    """The `error` event: Anthropic's error body, as the SDK raises it."""
    body = anthropic_error_body(error)
    return StreamEvent("error", {"error": body["error"]})


async def event_frames(events: AsyncIterator[StreamEvent], stream: OutputStream) -> AsyncGenerator[str, None]:
    """The events framed (for `OpenAIServing.event_stream`); an error mid-stream becomes an `error` event, which
    ends the stream. A client that disconnects closes the generator, and `finally` aborts the request."""
    try:
        async for event in events:
            yield event.frame()
    except EngineUnavailableError as error:
        yield error_event(APIError(503, str(error), code="engine_unavailable")).frame()
    except APIError as error:
        yield error_event(error).frame()
    except Exception as error:
        logger.exception("stream failed")
        yield error_event(APIError(500, f"internal server error: {error}")).frame()
    finally:
        stream.abort()
