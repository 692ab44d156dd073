"""POST /v1/chat/completions: chat template -> one engine request (n sequences) -> a response or SSE chunks.

Tools and reasoning: `_plan` checks `tools`, `tool_choice` and `chat_template_kwargs`, picks the parsers and, for a
forced tool choice, the grammar; each sequence's text then goes through a `SequenceParser` (`chat_output.py`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from radixlm.engine.engine_info import EngineInfo
from radixlm.engine.output_stream import OutputStream
from radixlm.outputs import CompletionOutput
from radixlm.server.chat_output import OutputParsing, SequenceParser, parse_message
from radixlm.server.chat_template import check_template_kwargs
from radixlm.server.errors import APIError
from radixlm.server.openai_logprobs import OpenAILogprobs
from radixlm.server.prompt_result import PromptResult, timings_of_results, usage_of
from radixlm.server.request_bodies import ChatCompletionRequest
from radixlm.server.response_bodies import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    DeltaMessage,
    Usage,
)
from radixlm.server.serving import OpenAIServing, new_request_id
from radixlm.server.tool_calling import (
    FunctionTool,
    after_reasoning,
    check_tool_choice,
    check_tools,
    tool_call_grammar,
)
from radixlm.structured.grammar_spec import GrammarSpec, check_json_spec
from radixlm.tool_parsers import ToolParser

_S = TypeVar("_S", GrammarSpec, GrammarSpec | None)


class ChatCompletions(OpenAIServing):
    """The handler; `create` is the FastAPI endpoint."""

    async def create(self, body: ChatCompletionRequest, raw_request: Request) -> Response:
        run = await self.start(body, raw_request)
        formatter = OpenAILogprobs(run.info.tokenizer)
        top_n = body.top_logprobs or 0
        if body.stream:
            chunks = self._chunks(run, body, formatter, top_n)
            return self.sse(chunks, run.stream)
        results = await self.collect(raw_request, run.stream, num_prompts=1)
        response = self._response(run.request_id, body, results[0], formatter, top_n, run.parsing)
        return JSONResponse(response.model_dump(mode="json"))

    async def start(self, body: ChatCompletionRequest, raw_request: Request, id_prefix: str = "chatcmpl") -> ChatRun:
        """Check, template and admit one chat request; the caller reads `ChatRun.stream` (and must end it: `collect`
        or `sse` do). The Responses and Messages APIs translate their bodies into a ChatCompletionRequest and
        start it here, so every API shares one path to the engine."""
        info = self.ready_info()
        self.check_request(body, info)
        plan = self._plan(body)
        try:
            params = await self.sampling_params(body, info, raw_request, plan.grammar)
        except APIError as error:
            if error.status == 400 and plan.forced_schemas:
                await self._name_bad_tool(plan, info, raw_request)
            raise
        prompt_ids = await self.chat_prompt(info, body.messages, body.add_generation_prompt, plan.tools,
                                            plan.template_kwargs)
        self.check_length(prompt_ids, body.requested_max_tokens(), info, param="messages")
        request_id = new_request_id(id_prefix)
        stream = await self.admit(request_id, [prompt_ids], params, body.engine_priority(), body.metadata,
                                  body.model)
        return ChatRun(request_id, stream, plan.parsing, info, prompt_ids)

    def _plan(self, body: ChatCompletionRequest) -> _Plan:
        """How this request's tools, template variables and reasoning shape its prompt, grammar and parsing."""
        options = self.chat_options
        try:
            functions = check_tools(body.tools) if body.tools is not None else []
            choice = check_tool_choice(body.tool_choice, functions)
            template_kwargs = check_template_kwargs(body.chat_template_kwargs)
            own_spec, own_field = body.grammar()
        except ValueError as error:
            raise APIError.bad_value(error) from None
        if choice == "auto" and not options.enable_auto_tool_choice:
            raise APIError(400, 'tool_choice "auto" (the default with tools) needs the server to run with '
                                '--enable-auto-tool-choice and --tool-call-parser', param="tool_choice")
        tool_parser = options.tool_parser() if functions and choice != "none" else None
        forced, forced_schemas = self._forced_grammar(tool_parser, functions, choice, body)
        grammar: tuple[GrammarSpec | None, str | None] = (own_spec, own_field)
        if forced is not None:
            if own_field is not None:
                raise APIError(400, f"{own_field} cannot be combined with tool_choice {choice!r}", param=own_field)
            grammar = (forced, "tool_choice")
        reasoning = options.reasoning()
        if reasoning is not None and grammar[0] is not None:
            if template_kwargs.get("enable_thinking") is False:
                reasoning = None  # the grammar holds the answer alone: no text of it is reasoning
            else:
                constrained, opened_in_prompt = grammar[0], reasoning.unclosed_is_reasoning
                grammar = (_spec(lambda: after_reasoning(constrained, opened_in_prompt), str(grammar[1])),
                           grammar[1])
                reasoning = reasoning.under_grammar()  # split where the grammar's structure puts </think>
        forced_names = () if forced is None else tuple(f.name for f in functions if choice in ("required", f.name))
        return _Plan(body.tools if functions else None, template_kwargs, grammar,
                     OutputParsing(reasoning, tool_parser, not body.parallel_tool_calls, forced_names,
                                   named_choice=choice not in ("none", "auto", "required")), forced_schemas)

    @staticmethod
    def _forced_grammar(tool_parser: ToolParser | None, functions: list[FunctionTool], choice: str,
                        body: ChatCompletionRequest) -> tuple[GrammarSpec | None, dict[str, GrammarSpec]]:
        """The grammar of a forced tool choice (None for "auto" and "none"), and the schemas it uses by the field
        each came from (to name a bad one: `_name_bad_tool`). Every tool's schema is checked for size, but only
        the forced grammar is compiled, as a whole: a client's tools fill the compile cache only when they
        constrain its output."""
        for i, function in enumerate(functions):
            _spec(partial(check_json_spec, function.parameters, "the schema"), f"tools.{i}.function.parameters")
        if tool_parser is None or choice == "auto":
            return None, {}
        schemas = {f"tools.{i}.function.parameters": _spec(partial(GrammarSpec.from_json_schema, function.parameters),
                                                           f"tools.{i}.function.parameters")
                   for i, function in enumerate(functions) if choice in ("required", function.name)}
        grammar = _spec(lambda: tool_call_grammar(tool_parser, functions, choice, body.parallel_tool_calls), "tools")
        return grammar, schemas

    async def _name_bad_tool(self, plan: _Plan, info: EngineInfo, raw_request: Request) -> None:
        """After the forced grammar failed to compile: a 400 naming the tool whose schema fails alone, if one does.
        Compiled one by one only now, so that a good request never holds its tools' schemas twice."""
        for param, schema in plan.forced_schemas.items():
            await self.compile_grammar(info, schema, param, raw_request)

    def _logprobs(self, body: ChatCompletionRequest, formatter: OpenAILogprobs, token_ids: list[int],
                  logprobs: list | None, top_n: int) -> ChatLogprobs | None:
        if not body.logprobs or logprobs is None:
            return None
        return formatter.chat(token_ids, logprobs, top_n)

    def _response(self, request_id: str, body: ChatCompletionRequest, result: PromptResult,
                  formatter: OpenAILogprobs, top_n: int, parsing: OutputParsing) -> ChatCompletion:
        choices = []
        for index, sequence in sorted(result.sequences.items()):
            message, parser = parse_message(parsing, sequence.text)
            choices.append(ChatChoice(
                index=index, message=message, stop_reason=sequence.stop_reason,
                logprobs=self._logprobs(body, formatter, sequence.token_ids, sequence.logprobs, top_n),
                finish_reason=parser.finish_reason(sequence.finish_reason)))
        return ChatCompletion(id=request_id, created=int(time.time()), model=self.response_model(body.model),
                              choices=choices, usage=usage_of([result]),
                              timings=timings_of_results([result]) if body.timings_per_token else None)

    async def _chunks(self, run: ChatRun, body: ChatCompletionRequest, formatter: OpenAILogprobs, top_n: int,
                      ) -> AsyncIterator[ChatCompletionChunk]:
        created = int(time.time())
        parsers = {index: SequenceParser(run.parsing) for index in range(body.n)}
        result = PromptResult(prompt_token_ids=run.prompt_ids)

        def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
            if usage is None and body.continuous_usage:
                usage = usage_of([result])
            return ChatCompletionChunk(id=run.request_id, created=created, model=self.response_model(body.model),
                                       choices=choices, usage=usage,
                                       timings=timings_of_results([result]) if body.timings_per_token else None)

        for index in range(body.n):  # OpenAI opens every choice with the role
            yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
        async for _, output in self.checked(run.stream):
            result.update(output)
            for sequence in output.outputs:
                for choice in self._sequence_choices(body, sequence, formatter, top_n, parsers[sequence.index]):
                    yield chunk([choice])
        if body.include_usage:
            yield chunk([], usage_of([result]))

    def _sequence_choices(self, body: ChatCompletionRequest, sequence: CompletionOutput, formatter: OpenAILogprobs,
                          top_n: int, parser: SequenceParser) -> list[ChatChunkChoice]:
        """This step's deltas (content, reasoning, tool calls; the logprobs ride on the first), then the finish."""
        logprobs = self._logprobs(body, formatter, sequence.delta_token_ids, sequence.delta_logprobs, top_n)
        deltas = parser.feed(sequence.delta_text, final=sequence.finished)
        if not deltas and logprobs is not None and logprobs.content:
            deltas = [DeltaMessage(content="")]
        choices = [ChatChunkChoice(index=sequence.index, delta=delta, logprobs=logprobs if i == 0 else None)
                   for i, delta in enumerate(deltas)]
        if sequence.finished:
            choices.append(ChatChunkChoice(index=sequence.index, delta=DeltaMessage(),
                                           finish_reason=parser.finish_reason(sequence.finish_reason)))
        return choices


@dataclass(frozen=True)
class ChatRun:
    """A chat request the engine has admitted: its id, its output stream, and how to read its text."""

    request_id: str
    stream: OutputStream
    parsing: OutputParsing
    info: EngineInfo
    prompt_ids: list[int]


@dataclass(frozen=True)
class _Plan:
    tools: list[dict[str, Any]] | None  # as the template gets them
    template_kwargs: dict[str, Any]
    grammar: tuple[GrammarSpec | None, str | None]  # the constraint and the field it came from
    parsing: OutputParsing
    forced_schemas: dict[str, GrammarSpec]  # a forced choice's function schemas, by the field each came from


def _spec(build: Callable[[], _S], param: str) -> _S:
    """`build()`, whose ValueError (a grammar past the size limits) becomes a 400 naming `param`."""
    try:
        return build()
    except ValueError as error:
        raise APIError(400, f"{param}: {error}", param=param) from None
