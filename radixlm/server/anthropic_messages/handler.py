"""POST /v1/messages and POST /v1/messages/count_tokens: a Messages body, translated into a chat request, run by
`ChatCompletions.start` (the one path to the engine), its text read by `SequenceParser` into content blocks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from radixlm.outputs import CompletionOutput
from radixlm.server.anthropic_messages.blocks import ContentAssembler
from radixlm.server.anthropic_messages.bodies import MessagesInput, MessagesRequest
from radixlm.server.anthropic_messages.events import (
    StreamEvent,
    event_frames,
    message_delta,
    message_start,
    message_stop,
    ping,
)
from radixlm.server.anthropic_messages.replies import Message, MessageUsage, message_id, stop_reason_of
from radixlm.server.anthropic_messages.translate import ChatTranslation, translate
from radixlm.server.chat import ChatCompletions, ChatRun
from radixlm.server.chat_output import SequenceParser
from radixlm.server.chat_template import check_template_kwargs
from radixlm.server.errors import APIError
from radixlm.server.prompt_result import PromptResult
from radixlm.server.tool_calling import check_tool_choice, check_tools

_T = TypeVar("_T")


class AnthropicMessages:
    """The Messages API on top of a `ChatCompletions` handler; `create` and `count_tokens` are the endpoints."""

    def __init__(self, chat: ChatCompletions) -> None:
        self.chat = chat

    async def create(self, body: MessagesRequest, raw_request: Request) -> Response:
        """A `message`, or its stream of events when `stream` is true."""
        translation = self._translate(body)
        run = await self._renamed(translation, self.chat.start(translation.request, raw_request, id_prefix="msg"))
        stop_sequences = tuple(body.stop_sequences or ())
        if body.stream:
            return self.chat.event_stream(event_frames(self._events(run, stop_sequences), run.stream))
        result = (await self.chat.collect(raw_request, run.stream, num_prompts=1))[0]
        assembler = ContentAssembler()
        assembler.feed(SequenceParser(run.parsing).feed(_reply(result).text, final=True))
        assembler.finish()
        return JSONResponse(self._message(run, result, assembler, stop_sequences).model_dump(mode="json"))

    async def count_tokens(self, body: MessagesInput) -> JSONResponse:
        """`{"input_tokens"}`: the prompt `create` would run for the same body (input plus cache-read tokens)."""
        info = self.chat.ready_info()
        self.chat.check_model(body.model)
        translation = self._translate(body)
        request = translation.request
        try:
            functions = check_tools(request.tools) if request.tools is not None else []
            check_tool_choice(request.tool_choice, functions)
            template_kwargs = check_template_kwargs(request.chat_template_kwargs)
        except ValueError as error:
            raise translation.renamed(APIError.bad_value(error)) from None
        prompt = self.chat.chat_prompt(info, request.messages, request.add_generation_prompt,
                                       request.tools if functions else None, template_kwargs)
        prompt_ids = await self._renamed(translation, prompt)
        return JSONResponse({"input_tokens": len(prompt_ids)})

    def _translate(self, body: MessagesInput) -> ChatTranslation:
        unsupported = body.unsupported_field()
        if unsupported is not None:
            raise APIError(400, f"{unsupported} is not supported by this server", param=unsupported,
                           code="unsupported_parameter")
        return translate(body, reasoning=self.chat.chat_options.reasoning_parser is not None)

    @staticmethod
    async def _renamed(translation: ChatTranslation, work: Awaitable[_T]) -> _T:
        """`work`'s result; its errors name the Anthropic fields rather than the chat request's."""
        try:
            return await work
        except APIError as error:
            raise translation.renamed(error) from None

    async def _events(self, run: ChatRun, stop_sequences: tuple[str, ...]) -> AsyncIterator[StreamEvent]:
        """message_start once the first output has come (so that its usage counts the cached tokens), a ping, the
        blocks as they are generated, then message_delta and message_stop."""
        parser, assembler, result = SequenceParser(run.parsing), ContentAssembler(), PromptResult()
        async for _, output in self.chat.checked(run.stream):
            first = not result.sequences
            result.update(output)
            if first:
                usage = MessageUsage.of(result).model_copy(update={"output_tokens": 0})
                yield message_start(Message(id=message_id(run.request_id), model=self.chat.model_name, content=[],
                                            stop_reason=None, stop_sequence=None, usage=usage))
                yield ping()
            for sequence in output.outputs:
                for event in assembler.feed(parser.feed(sequence.delta_text, final=sequence.finished)):
                    yield event
        for event in assembler.finish():
            yield event
        message = self._message(run, result, assembler, stop_sequences)
        yield message_delta(message.stop_reason or "end_turn", message.stop_sequence, message.usage)
        yield message_stop()

    def _message(self, run: ChatRun, result: PromptResult, assembler: ContentAssembler,
                 stop_sequences: tuple[str, ...]) -> Message:
        """The finished reply."""
        stop_reason, stop_sequence = stop_reason_of(_reply(result), assembler.num_tool_uses, stop_sequences)
        return Message(id=message_id(run.request_id), model=self.chat.model_name, content=assembler.blocks(),
                       stop_reason=stop_reason, stop_sequence=stop_sequence, usage=MessageUsage.of(result))


def _reply(result: PromptResult) -> CompletionOutput:
    """The request's one sequence (a Messages request has no `n`)."""
    if 0 not in result.sequences:
        raise APIError(500, "the engine ended the request without an output", code="request_failed")
    return result.sequences[0]
