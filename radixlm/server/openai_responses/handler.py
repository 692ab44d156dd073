"""The Responses endpoints: POST /v1/responses (`create`), GET and DELETE /v1/responses/{id}.

`create` translates the body into a chat request (`translate.py`), starts it with `ChatCompletions.start` (chat's
checks, template, grammar and admission), and reads the sequence with chat's `SequenceParser` into output items
(`events.py`): whole, or as typed SSE events (`event: <type>`, `data: {json}` with `sequence_number`; no `[DONE]`,
as OpenAI ends these streams). A response that finished is stored (unless `store` is false) with its conversation,
so `previous_response_id` renders input + output + the new input through the same template: the prompt's prefix is
the previous prompt's, and the radix cache serves it again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse

from radixlm.engine.async_engine import EngineUnavailableError
from radixlm.outputs import CompletionOutput
from radixlm.server.chat import ChatCompletions, ChatRun
from radixlm.server.chat_output import SequenceParser
from radixlm.server.errors import APIError
from radixlm.server.openai_responses.bodies import (
    IncompleteDetails,
    ResponseErrorBody,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from radixlm.server.openai_responses.events import Event, OutputAssembler, sse_frame
from radixlm.server.openai_responses.store import ResponseStore
from radixlm.server.openai_responses.translate import (
    ChatTranslation,
    chat_request,
    echoed_tools,
    responses_error,
)
from radixlm.server.prompt_result import PromptResult

logger = logging.getLogger(__name__)
_UNSTORED_FINISHES = ("abort", "error")  # a response no one received is not worth continuing


class OpenAIResponses:
    """One per app: the chat handler it runs requests through, and the app's response store."""

    def __init__(self, chat: ChatCompletions, store: ResponseStore | None = None) -> None:
        self.chat = chat
        self.store = store if store is not None else ResponseStore()

    async def create(self, body: ResponsesRequest, raw_request: Request) -> Response:
        """POST /v1/responses: the Response object, or its SSE events when `stream`; a field this server cannot
        honour, or a bad value, is a 400 naming it; an unknown `previous_response_id` is a 404."""
        unsupported = body.unsupported_field()
        if unsupported is not None:
            raise APIError(400, f"{unsupported} is not supported by this server", param=unsupported,
                           code="unsupported_parameter")
        previous_items = self._previous_conversation(body.previous_response_id)
        translation = _translated(body, previous_items)
        try:
            run = await self.chat.start(translation.body, raw_request, id_prefix="resp")
        except APIError as error:
            raise responses_error(error, translation.origins) from None
        draft = self._draft(run, body)
        conversation = [*previous_items, *translation.new_items]
        if body.stream:
            return self._sse(self._events(draft, run, conversation), run)
        result = (await self.chat.collect(raw_request, run.stream, num_prompts=1))[0]
        assembler = OutputAssembler()
        assembler.feed(SequenceParser(run.parsing).feed(_sequence(result).text, final=True))
        assembler.finish(incomplete=_sequence(result).finish_reason == "length")
        return JSONResponse(await self._finished(draft, run, result, assembler, conversation))

    async def retrieve(self, response_id: str, stream: bool = False) -> JSONResponse:
        """GET /v1/responses/{id}: the stored Response object; 404 if unknown, expired, deleted or not stored."""
        if stream:
            raise APIError(400, "stream is not supported when retrieving a response: it has finished",
                           param="stream")
        entry = self.store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return JSONResponse(entry.response)

    async def delete(self, response_id: str) -> JSONResponse:
        """DELETE /v1/responses/{id}: OpenAI's `{"id", "object": "response", "deleted": true}`, or a 404."""
        if not self.store.delete(response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    def _previous_conversation(self, response_id: str | None) -> list[dict]:
        if response_id is None:
            return []
        entry = self.store.get(response_id)
        if entry is None:
            raise APIError(404, f"previous response with id {response_id!r} not found (not stored, expired or "
                                f"deleted)", param="previous_response_id", code="previous_response_not_found")
        return entry.conversation

    def _draft(self, run: ChatRun, body: ResponsesRequest) -> ResponseObject:
        """The Response object before any output: what the stream opens with, and what the output completes."""
        text_format = (body.text or {}).get("format") or {"type": "text"}
        return ResponseObject(
            # the engine's request id (`resp-<hex>`, in metrics and traces) as OpenAI spells a response's
            id=run.request_id.replace("-", "_", 1), created_at=int(time.time()), model=self.chat.model_name,
            instructions=body.instructions, max_output_tokens=body.max_output_tokens,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            previous_response_id=body.previous_response_id, store=body.stores,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, text={"format": text_format},
            tool_choice=body.tool_choice or "auto", tools=echoed_tools(body.tools), user=body.user,
            metadata=body.metadata or {})

    async def _finished(self, draft: ResponseObject, run: ChatRun, result: PromptResult, assembler: OutputAssembler,
                        conversation: list[dict]) -> dict:
        """The finished Response object's JSON (stored unless `store` is false); the assembler is finished."""
        sequence = _sequence(result)
        reasoning = assembler.reasoning_text
        reasoning_ids = await self.chat.encode(run.info, reasoning, False, "reasoning") if reasoning else []
        incomplete = sequence.finish_reason == "length"
        response = draft.model_copy(update={
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": IncompleteDetails() if incomplete else None, "output": list(assembler.items),
            "usage": ResponseUsage.of(len(result.prompt_token_ids), result.num_cached_tokens,
                                      len(sequence.token_ids), min(len(reasoning_ids), len(sequence.token_ids)))})
        body = response.model_dump(mode="json")
        if draft.store and sequence.finish_reason not in _UNSTORED_FINISHES:
            # Too large to keep alone (past the store's byte limit): say so rather than 404 on a later GET.
            body["store"] = self.store.put(draft.id, body, [*conversation, *body["output"]])
        return body

    async def _events(self, draft: ResponseObject, run: ChatRun, conversation: list[dict]) -> AsyncIterator[Event]:
        """The stream: created, in_progress, the output's events, then completed or incomplete (failed, after
        an error event, if the request fails)."""
        yield {"type": "response.created", "response": draft.model_dump(mode="json")}
        yield {"type": "response.in_progress", "response": draft.model_dump(mode="json")}
        assembler, parser, result = OutputAssembler(), SequenceParser(run.parsing), PromptResult()
        try:
            async for _, output in self.chat.checked(run.stream):
                result.update(output)
                for sequence in output.outputs:
                    for event in assembler.feed(parser.feed(sequence.delta_text, final=sequence.finished)):
                        yield event
            incomplete = _sequence(result).finish_reason == "length"
            for event in assembler.finish(incomplete):
                yield event
            body = await self._finished(draft, run, result, assembler, conversation)
        except Exception as error:
            for event in _failure_events(draft, assembler, error):
                yield event
            return
        yield {"type": "response.incomplete" if incomplete else "response.completed", "response": body}

    def _sse(self, events: AsyncIterator[Event], run: ChatRun) -> EventSourceResponse:
        """Frame the events (with chat's keep-alive comments on long waits); a client that disconnects cancels the
        generator, and `finally` aborts the request."""
        async def frames() -> AsyncGenerator[bytes, None]:
            try:
                async with contextlib.aclosing(events):
                    sequence_number = 0
                    async for event in events:
                        yield sse_frame(event, sequence_number)
                        sequence_number += 1
            finally:
                run.stream.abort()

        return self.chat.event_stream(frames())  # type: ignore[arg-type]  # Starlette sends str and bytes alike


def _translated(body: ResponsesRequest, previous_items: list[dict]) -> ChatTranslation:
    try:
        return chat_request(body, previous_items)
    except ValueError as error:  # a ParamError names the field it is about
        raise APIError.bad_value(error) from None


def _sequence(result: PromptResult) -> CompletionOutput:
    if 0 not in result.sequences:
        raise APIError(500, "the engine returned no sequence", code="request_failed")
    return result.sequences[0]


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"response with id {response_id[:128]!r} not found (not stored, expired or deleted)",
                    param="response_id", code="response_not_found")


def _failure_events(draft: ResponseObject, assembler: OutputAssembler, error: Exception) -> list[Event]:
    """An `error` event, then `response.failed` with the output so far."""
    if isinstance(error, EngineUnavailableError):
        error = APIError(503, str(error), code="engine_unavailable")
    elif not isinstance(error, APIError):
        logger.exception("response stream failed", exc_info=error)
        error = APIError(500, f"internal server error: {error}")
    code = error.code or ("server_error" if error.status >= 500 else error.type)
    failed = draft.model_copy(update={"status": "failed", "output": list(assembler.items),
                                      "error": ResponseErrorBody(code=code, message=error.message)})
    return [{"type": "error", "code": code, "message": error.message, "param": error.param},
            {"type": "response.failed", "response": failed.model_dump(mode="json")}]
