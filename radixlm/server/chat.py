"""POST /v1/chat/completions: chat template -> one engine request (n sequences) -> a response or SSE chunks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from radixlm.engine.async_engine import OutputStream
from radixlm.engine.outputs import CompletionOutput
from radixlm.server.logprobs import OpenAILogprobs
from radixlm.server.protocol import ChatCompletionRequest
from radixlm.server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    DeltaMessage,
    Usage,
)
from radixlm.server.serving import OpenAIServing, PromptResult, new_request_id, usage_of


class ChatCompletions(OpenAIServing):
    """The handler; `create` is the FastAPI endpoint."""

    async def create(self, body: ChatCompletionRequest, raw_request: Request) -> Response:
        info = self.ready_info()
        self.check_request(body, info)
        params = await self.sampling_params(body, info)
        prompt_ids = await self.chat_prompt(info, body.messages, body.add_generation_prompt)
        self.check_length(prompt_ids, body.requested_max_tokens(), info, param="messages")
        request_id = new_request_id("chatcmpl")
        stream = await self.admit(request_id, [prompt_ids], params, body.priority, body.metadata)
        formatter = OpenAILogprobs(info.tokenizer)
        top_n = body.top_logprobs or 0
        if body.stream:
            chunks = self._chunks(request_id, body, stream, formatter, top_n)
            return self.sse(chunks, stream)
        results = await self.collect(raw_request, stream, num_prompts=1)
        return JSONResponse(self._response(request_id, body, results[0], formatter, top_n).model_dump(mode="json"))

    def _logprobs(self, body: ChatCompletionRequest, formatter: OpenAILogprobs, token_ids: list[int],
                  logprobs: list | None, top_n: int) -> ChatLogprobs | None:
        if not body.logprobs or logprobs is None:
            return None
        return formatter.chat(token_ids, logprobs, top_n)

    def _response(self, request_id: str, body: ChatCompletionRequest, result: PromptResult,
                  formatter: OpenAILogprobs, top_n: int) -> ChatCompletion:
        choices = [
            ChatChoice(index=index, message=AssistantMessage(content=sequence.text),
                       logprobs=self._logprobs(body, formatter, sequence.token_ids, sequence.logprobs, top_n),
                       finish_reason=sequence.finish_reason, stop_reason=sequence.stop_reason)
            for index, sequence in sorted(result.sequences.items())]
        return ChatCompletion(id=request_id, created=int(time.time()), model=self.model_name, choices=choices,
                              usage=usage_of([result]))

    async def _chunks(self, request_id: str, body: ChatCompletionRequest, stream: OutputStream,
                      formatter: OpenAILogprobs, top_n: int) -> AsyncIterator[ChatCompletionChunk]:
        created = int(time.time())

        def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=request_id, created=created, model=self.model_name, choices=choices,
                                       usage=usage)

        for index in range(body.n):  # OpenAI opens every choice with the role
            yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
        result = PromptResult()
        async for _, output in self.checked(stream):
            result.update(output)
            for sequence in output.outputs:
                for choice in self._sequence_choices(body, sequence, formatter, top_n):
                    yield chunk([choice])
        if body.include_usage:
            yield chunk([], usage_of([result]))

    def _sequence_choices(self, body: ChatCompletionRequest, sequence: CompletionOutput,
                          formatter: OpenAILogprobs, top_n: int) -> list[ChatChunkChoice]:
        """A content delta (if this step added text or tokens with logprobs), then the finish, if finished."""
        choices = []
        logprobs = self._logprobs(body, formatter, sequence.delta_token_ids, sequence.delta_logprobs, top_n)
        if sequence.delta_text or (logprobs is not None and logprobs.content):
            choices.append(ChatChunkChoice(index=sequence.index, delta=DeltaMessage(content=sequence.delta_text),
                                           logprobs=logprobs))
        if sequence.finished:
            choices.append(ChatChunkChoice(index=sequence.index, delta=DeltaMessage(),
                                           finish_reason=sequence.finish_reason))
        return choices
