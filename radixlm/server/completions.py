"""POST /v1/completions: one engine request per prompt (each with n sequences) -> a response or SSE chunks.

Choice `i * n + j` is sequence j of prompt i, as OpenAI numbers them. `echo` prepends the prompt text (and, with
`logprobs`, the prompt's logprobs, the first position being null) to every choice; with `max_tokens: 0` that is all
a choice holds (prompt scoring).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from radixlm.engine.engine_info import EngineInfo
from radixlm.engine.output_stream import OutputStream
from radixlm.outputs import CompletionOutput, PositionLogprobs
from radixlm.server.errors import APIError
from radixlm.server.openai_logprobs import OpenAILogprobs
from radixlm.server.prompt_result import PromptResult, timings_of_results, usage_of
from radixlm.server.request_bodies import CompletionRequest
from radixlm.server.response_bodies import Completion, CompletionChoice, CompletionLogprobs
from radixlm.server.serving import OpenAIServing, new_request_id


@dataclass(frozen=True)
class _Prompt:
    text: str  # for echo
    token_ids: list[int]


def _merge(first: CompletionLogprobs, second: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(tokens=first.tokens + second.tokens,
                              token_logprobs=first.token_logprobs + second.token_logprobs,
                              top_logprobs=first.top_logprobs + second.top_logprobs,
                              text_offset=first.text_offset + second.text_offset)


def _without_generation(sequence: CompletionOutput) -> CompletionOutput:
    """The sequence as a prompt-scoring request (`echo`, `max_tokens: 0`) reports it: the one token the engine
    generated is dropped, and the choice ends with "length", as vLLM's does."""
    return replace(sequence, text="", token_ids=[], delta_text="", delta_token_ids=[], logprobs=[],
                   delta_logprobs=[], cumulative_logprob=None, stop_reason=None,
                   finish_reason="length" if sequence.finished else None)


class Completions(OpenAIServing):
    """The handler; `create` is the FastAPI endpoint."""

    async def create(self, body: CompletionRequest, raw_request: Request) -> Response:
        info = self.ready_info()
        self.check_request(body, info)
        prompt_list = self._prompt_list(body, info)  # before any work for them: a grammar, tokenizing
        params = await self.sampling_params(body, info, raw_request)
        prompts = await self._prompts(body, prompt_list, info)
        for prompt in prompts:
            self.check_length(prompt.token_ids, body.max_tokens, info, param="prompt")
        request_id = new_request_id("cmpl")
        stream = await self.admit(request_id, [p.token_ids for p in prompts], params, body.priority, body.metadata,
                                  body.model)
        formatter = OpenAILogprobs(info.tokenizer)
        if body.stream:
            return self.sse(self._chunks(request_id, body, prompts, stream, formatter), stream)
        results = await self.collect(raw_request, stream, num_prompts=len(prompts))
        if body.scores_prompt_only():
            for result in results:
                result.sequences = {i: _without_generation(s) for i, s in result.sequences.items()}
        choices = [self._choice(body, prompt, result.prompt_logprobs, sequence, formatter)
                   for prompt, result in zip(prompts, results, strict=True)
                   for _, sequence in sorted(result.sequences.items())]
        for i, choice in enumerate(choices):
            choice.index = i
        response = Completion(id=request_id, created=int(time.time()), model=self.response_model(body.model),
                              choices=choices,
                              usage=usage_of(results),
                              timings=timings_of_results(results) if body.timings_per_token else None)
        return JSONResponse(response.model_dump(mode="json"))

    @staticmethod
    def _prompt_list(body: CompletionRequest, info: EngineInfo) -> list[str] | list[list[int]]:
        """The request's prompts, at most the server's limit of them (each is a request of its own)."""
        try:
            prompts = body.prompts()
        except ValueError as error:
            raise APIError(400, str(error), param="prompt") from None
        limit, flag = info.prompts_per_request_limit
        if len(prompts) > limit:
            raise APIError(400, f"prompt holds {len(prompts)} prompts; one request may hold at most {limit} ({flag})",
                           param="prompt")
        return prompts

    async def _prompts(self, body: CompletionRequest, prompts: list[str] | list[list[int]],
                       info: EngineInfo) -> list[_Prompt]:
        result = []
        for prompt in prompts:
            if isinstance(prompt, str):
                result.append(_Prompt(prompt, await self.encode(info, prompt, True, param="prompt")))
                continue
            bad = [t for t in prompt if not 0 <= t < info.vocab_size]
            if bad:
                raise APIError(400, f"prompt token id {bad[0]} is outside the vocabulary [0, {info.vocab_size})",
                               param="prompt")
            result.append(_Prompt(await self.decode(info, prompt) if body.echo else "", list(prompt)))
        return result

    def _logprobs(self, body: CompletionRequest, formatter: OpenAILogprobs, token_ids: list[int],
                  positions: list[PositionLogprobs] | None, text_offset: int) -> CompletionLogprobs | None:
        if body.logprobs is None:
            return None
        return formatter.completion(token_ids, positions or [{}] * len(token_ids), body.logprobs, text_offset)

    def _echo_logprobs(self, body: CompletionRequest, formatter: OpenAILogprobs, prompt: _Prompt,
                       prompt_logprobs: list[PositionLogprobs | None] | None) -> CompletionLogprobs | None:
        if body.logprobs is None or not body.echo:
            return None
        positions = prompt_logprobs or [None] * len(prompt.token_ids)
        return formatter.completion(prompt.token_ids, positions, body.logprobs, 0)

    def _choice(self, body: CompletionRequest, prompt: _Prompt, prompt_logprobs: list | None,
                sequence: CompletionOutput, formatter: OpenAILogprobs) -> CompletionChoice:
        echo = prompt.text if body.echo else ""
        logprobs = self._logprobs(body, formatter, sequence.token_ids, sequence.logprobs, len(echo))
        echo_logprobs = self._echo_logprobs(body, formatter, prompt, prompt_logprobs)
        if logprobs is not None and echo_logprobs is not None:
            logprobs = _merge(echo_logprobs, logprobs)
        return CompletionChoice(index=sequence.index, text=echo + sequence.text, logprobs=logprobs,
                                finish_reason=sequence.finish_reason, stop_reason=sequence.stop_reason)

    async def _chunks(self, request_id: str, body: CompletionRequest, prompts: list[_Prompt],
                      stream: OutputStream, formatter: OpenAILogprobs) -> AsyncIterator[Completion]:
        created = int(time.time())
        results = [PromptResult(prompt_token_ids=p.token_ids) for p in prompts]
        text_offsets: dict[int, int] = {}  # choice index -> characters sent so far
        async for prompt_index, output in self.checked(stream):
            if body.scores_prompt_only():
                output = replace(output, outputs=[_without_generation(s) for s in output.outputs])
            results[prompt_index].update(output)
            prompt = prompts[prompt_index]
            for sequence in output.outputs:
                choice_index = prompt_index * body.n + sequence.index
                text, logprobs = sequence.delta_text, None
                if choice_index not in text_offsets and body.echo:
                    text = prompt.text + text
                    logprobs = self._echo_logprobs(body, formatter, prompt, output.prompt_logprobs)
                offset = text_offsets.get(choice_index, 0) + len(text) - len(sequence.delta_text)
                delta_logprobs = self._logprobs(body, formatter, sequence.delta_token_ids, sequence.delta_logprobs,
                                                offset)
                if delta_logprobs is not None:
                    logprobs = delta_logprobs if logprobs is None else _merge(logprobs, delta_logprobs)
                text_offsets[choice_index] = offset + len(sequence.delta_text)
                if not text and logprobs is None and not sequence.finished:
                    continue  # a token whose text is held back (part of a UTF-8 character): nothing to send yet
                choice = CompletionChoice(index=choice_index, text=text, logprobs=logprobs,
                                          finish_reason=sequence.finish_reason, stop_reason=sequence.stop_reason)
                yield Completion(id=request_id, created=created, model=self.response_model(body.model),
                                 choices=[choice],
                                 usage=usage_of(results) if body.continuous_usage else None,
                                 timings=timings_of_results(results) if body.timings_per_token else None)
        if body.include_usage:
            yield Completion(id=request_id, created=created, model=self.response_model(body.model), choices=[],
                             usage=usage_of(results))
