"""What chat and completions share: checks, admission, result tracking, SSE framing, disconnect handling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.sse import EventSourceResponse, format_sse_event
from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from radixlm.core.scheduler import QueueFullError
from radixlm.engine.admission import check_vocabulary
from radixlm.engine.async_engine import AsyncEngine, EngineUnavailableError
from radixlm.engine.engine_info import EngineInfo
from radixlm.engine.output_stream import OutputStream
from radixlm.outputs import RequestOutput
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams
from radixlm.server.chat_options import ChatOptions
from radixlm.server.chat_template import chat_prompt_ids
from radixlm.server.errors import APIError
from radixlm.server.prompt_result import PromptResult
from radixlm.server.request_bodies import ChatMessage, SamplingRequest
from radixlm.server.tokenization import Tokenization, num_text_chars
from radixlm.structured.grammar_spec import GrammarSpec

logger = logging.getLogger(__name__)
_MAX_TOKEN_ID_DIGITS = 20
_CHARS_PER_TOKEN = 4  # a detokenize job's size, for its lane and turn: about what its text will be
DEFAULT_KEEPALIVE_SECONDS = 15.0  # FastAPI's and sse-starlette's interval
KEEPALIVE_FRAME = ": ping\n\n"  # an SSE comment: every client skips it
_PARAMS = frozenset({"prompt", "messages", *SamplingRequest.model_fields})


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _decode(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids)


class OpenAIServing:
    """Base of the chat and completions handlers: one per app, holding the app's engine."""

    def __init__(self, async_engine: AsyncEngine, model_name: str, tokenization: Tokenization,
                 chat_options: ChatOptions | None = None,
                 keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS) -> None:
        self.async_engine = async_engine
        self.model_name = model_name
        self.tokenization = tokenization
        self.chat_options = chat_options or ChatOptions()
        self.keepalive_seconds = keepalive_seconds

    # -- tokenizer work, on the tokenizer lanes ----------------------------------------------------------------
    async def encode(self, info: EngineInfo, text: str, add_special_tokens: bool, param: str) -> list[int]:
        """Token ids of `text`; 400 naming `param`, without tokenizing, if it can never fit the context."""
        await self.tokenization.check_can_fit(info.tokenizer, len(text), info.max_model_len, param)
        return await self.tokenization.run(info.tokenizer, len(text), _encode, text, add_special_tokens)

    async def chat_prompt(self, info: EngineInfo, messages: list[ChatMessage], add_generation_prompt: bool,
                          tools: list[dict[str, Any]] | None = None, template_kwargs: dict[str, Any] | None = None,
                          ) -> list[int]:
        """The conversation's prompt ids; refused (400) before templating if the text the template is given (every
        string of the messages, the tools and the template variables) can never fit."""
        parts = {"messages": num_text_chars([m.model_dump(exclude_none=True) for m in messages]),
                 "tools": num_text_chars(tools), "chat_template_kwargs": num_text_chars(template_kwargs)}
        num_chars = sum(parts.values())
        await self.tokenization.check_can_fit(info.tokenizer, num_chars, info.max_model_len,
                                              max(parts, key=lambda name: parts[name]))
        return await self.tokenization.run(info.tokenizer, num_chars, chat_prompt_ids, messages,
                                           add_generation_prompt, tools, self.chat_options.template_text,
                                           template_kwargs)

    async def decode(self, info: EngineInfo, token_ids: list[int]) -> str:
        return await self.tokenization.run(info.tokenizer, len(token_ids) * _CHARS_PER_TOKEN, _decode, token_ids)

    # -- checks ------------------------------------------------------------------------------------------------
    def ready_info(self) -> EngineInfo:
        reason = self.async_engine.unavailable_reason
        if reason is not None or self.async_engine.info is None:
            raise APIError(503, f"{reason or 'the model is loading'}; retry later", code="engine_unavailable")
        return self.async_engine.info

    def check_model(self, model: str | None) -> str | None:
        """The LoRA adapter `model` names (None: the base model); 404 for a name this server does not serve."""
        if model is None or model == self.model_name:
            return None
        if model in self.async_engine.lora_requests:
            return model
        adapters = f" or a loaded LoRA adapter ({', '.join(sorted(self.async_engine.lora_requests))})" \
            if self.async_engine.lora_requests else ""
        raise APIError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}{adapters}",
                       param="model", code="model_not_found")

    def response_model(self, model: str | None) -> str:
        """The `model` a response names: the LoRA adapter the request asked for (as vLLM answers), else the served
        model's name."""
        return model if model is not None and model in self.async_engine.lora_requests else self.model_name

    def check_request(self, body: SamplingRequest, info: EngineInfo) -> None:
        """Checks that need more than one field or the engine's configuration."""
        self.check_model(body.model)
        unsupported = body.unsupported_field()
        if unsupported is not None:
            raise APIError(400, f"{unsupported} is not supported by this server yet", param=unsupported,
                           code="unsupported_parameter")
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
        if body.stream and body.best_of is not None and body.best_of != body.n:
            raise APIError(400, "best_of must equal n when streaming", param="best_of")
        if body.priority != 0 and info.schedule_policy != "priority":
            raise APIError(400, f"priority needs --schedule-policy priority (this server uses "
                                f"{info.schedule_policy!r})", param="priority")
        too_long = [key for key in body.logit_bias or {} if len(key) > _MAX_TOKEN_ID_DIGITS]
        if too_long:  # int() of a key this long is slow or refused (Python's int-string limit)
            raise APIError(400, f"logit_bias key {too_long[0][:24]}... ({len(too_long[0])} characters) is not a "
                                f"token id", param="logit_bias")

    async def sampling_params(self, body: SamplingRequest, info: EngineInfo, raw_request: Request,
                              grammar: tuple[GrammarSpec | None, str | None] | None = None) -> SamplingParams:
        """The request's SamplingParams, its grammar (if any) already compiled: a bad one is a 400 naming it.
        `grammar` (spec, the field it came from) replaces the one the request's structured-output fields set."""
        try:
            params = body.to_sampling_params() if grammar is None else \
                body.to_sampling_params(structured_outputs=grammar[0])
            check_vocabulary(params, info.vocab_size)  # before the grammar compiles
        except ValueError as error:
            raise APIError.bad_value(error, type(body).model_fields) from None
        if params.structured_outputs is not None:
            _, field = body.grammar() if grammar is None else grammar
            await self.compile_grammar(info, params.structured_outputs, str(field), raw_request)
        return params

    @staticmethod
    async def compile_grammar(info: EngineInfo, spec: GrammarSpec, param: str, raw_request: Request) -> None:
        """Compile on the compile thread (the engine will find it in the compile cache); a bad one is a 400. A client
        that disconnects meanwhile stops waiting, and its compile leaves the queue if no one else waits for it."""
        # Shielded: the Future is shared by every request with this grammar, and must not be cancelled from here.
        compiled = asyncio.shield(asyncio.wrap_future(info.structured.submit(spec, client=True)))
        gone = asyncio.create_task(_disconnected(raw_request))
        try:
            await asyncio.wait((compiled, gone), return_when=asyncio.FIRST_COMPLETED)
            if not compiled.done() or compiled.cancelled():  # the client left (and maybe its compile with it)
                compiled.add_done_callback(_consume)
                raise APIError(499, "the client disconnected while its grammar compiled", param=param)
            compiled.result()
        except ValueError as error:
            raise APIError(400, f"{param}: {error}", param=param) from None
        finally:
            gone.cancel()
            info.structured.release(spec)

    @staticmethod
    def check_length(prompt_ids: list[int], max_tokens: int | None, info: EngineInfo, param: str) -> None:
        """400 `context_length_exceeded` in OpenAI's words ("This model's maximum context length is ..."), which
        clients match on (litellm's ContextWindowExceededError and its fallbacks)."""
        context, num_prompt = info.max_model_len, len(prompt_ids)
        if num_prompt >= context:
            raise APIError(400, f"This model's maximum context length is {context} tokens. However, your {param} "
                                f"resulted in {num_prompt} tokens, leaving no room to generate. Please reduce the "
                                f"length of the {param}.", param=param, code="context_length_exceeded")
        if max_tokens is not None and num_prompt + max_tokens > context:
            raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                                f"{num_prompt + max_tokens} tokens ({num_prompt} in the {param}, {max_tokens} in the "
                                f"completion). Please reduce the length of the {param} or completion.",
                           param="max_tokens", code="context_length_exceeded")

    # -- running -----------------------------------------------------------------------------------------------
    async def admit(self, request_id: str, prompts: list[list[int]], params: SamplingParams | PoolingParams,
                    priority: int, metadata: dict[str, str] | None = None, model: str | None = None) -> OutputStream:
        """Admit the requests, running the LoRA adapter `model` names (the base model for its own name or None)."""
        lora_name = self.check_model(model)
        try:
            return await self.async_engine.generate(request_id, prompts, params, priority=priority,
                                                    arrival_time=time.monotonic(), metadata=metadata,
                                                    lora_name=lora_name)
        except QueueFullError as error:
            raise APIError(429, f"the server is busy: {error}; retry later", code="queue_full") from None
        except EngineUnavailableError as error:
            raise APIError(503, f"{error}; retry later", code="engine_unavailable") from None
        except ValueError as error:  # the engine's own admission checks (ParamError names the field)
            raise APIError.bad_value(error, _PARAMS) from None

    async def collect(self, raw_request: Request, stream: OutputStream, num_prompts: int) -> list[PromptResult]:
        """Run to the end; a client that disconnects meanwhile aborts the requests (their KV blocks are freed)."""
        results = [PromptResult() for _ in range(num_prompts)]
        watcher = asyncio.create_task(_abort_on_disconnect(raw_request, stream))
        try:
            async for prompt_index, output in self.checked(stream):
                results[prompt_index].update(output)
        except EngineUnavailableError as error:
            raise APIError(503, str(error), code="engine_unavailable") from None
        finally:
            watcher.cancel()
            stream.abort()
        return results

    @staticmethod
    async def checked(stream: OutputStream) -> AsyncIterator[tuple[int, RequestOutput]]:
        """The stream's outputs; a request that failed alone (`RequestOutput.error`) raises a 500 APIError before
        any of its output is used, so "error" never appears as an OpenAI finish_reason."""
        async for prompt_index, output in stream:
            if output.error is not None:
                raise APIError(500, f"the request failed: {output.error}", code="request_failed")
            yield prompt_index, output

    def event_stream(self, frames: AsyncGenerator[str, None]) -> EventSourceResponse:
        """An SSE response of already framed events, with a keep-alive comment on long waits (`with_keepalive`)."""
        return EventSourceResponse(with_keepalive(frames, self.keepalive_seconds),
                                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def sse(self, chunks: AsyncIterator[BaseModel], stream: OutputStream) -> EventSourceResponse:
        """Frame chunks as `data: {json}`, end with `data: [DONE]`; an error mid-stream becomes an error event.

        A client that disconnects cancels the generator (Starlette), and `finally` aborts the requests.
        """
        async def frames() -> AsyncIterator[str]:
            try:
                async for chunk in chunks:
                    yield format_sse_event(data_str=chunk.model_dump_json())
            except EngineUnavailableError as error:
                yield _error_frame(APIError(503, str(error), code="engine_unavailable"))
            except APIError as error:
                yield _error_frame(error)
            except Exception as error:
                logger.exception("stream failed")
                yield _error_frame(APIError(500, f"internal server error: {error}"))
            finally:
                stream.abort()
            yield format_sse_event(data_str="[DONE]")

        return self.event_stream(frames())


async def with_keepalive(frames: AsyncGenerator[str, None], interval: float) -> AsyncIterator[str]:
    """`frames`, with an SSE comment (`: ping`) each time `interval` seconds pass without a frame, so that proxies
    and clients with read timeouts keep a long wait (a full queue, a long prefill) open. Closing this generator
    (a client that left) cancels the wait and closes `frames`, whose `finally` then runs."""
    pending = asyncio.ensure_future(anext(frames))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEPALIVE_FRAME
                continue
            try:
                frame = pending.result()
            except StopAsyncIteration:
                return
            yield frame
            pending = asyncio.ensure_future(anext(frames))
    finally:
        pending.cancel()
        with contextlib.suppress(BaseException):  # the frames' own end: cancelled, finished or failed
            await pending
        await frames.aclose()


def _error_frame(error: APIError) -> str:
    return format_sse_event(data_str=json.dumps(error.body()))


async def _disconnected(raw_request: Request) -> None:
    """Returns once the client has gone (the body has been read already: only a disconnect can arrive)."""
    try:
        while (await raw_request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a transport that cannot say: treat it as gone rather than leave the error unretrieved
        logger.debug("receive failed while waiting for a grammar", exc_info=True)


def _consume(future: asyncio.Future[object]) -> None:
    """Retrieve a result no one awaits any more, so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


async def _abort_on_disconnect(raw_request: Request, stream: OutputStream) -> None:
    await _disconnected(raw_request)
    stream.abort()
