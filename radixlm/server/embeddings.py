"""POST /v1/embeddings (OpenAI's and vLLM's shape): one engine request per input, pooled, never sampled.

Each input (a string, or a list of token ids) becomes an embedding request (`PoolingParams`) that the scheduler
batches with every other request, like any prefill; its vector is the model's final hidden states pooled by the
server's `--pooling` (last or mean), L2-normalized. `encoding_format` "float" sends the vector as JSON numbers,
"base64" as the base64 text of its little-endian float32 bytes (what the openai SDK asks for by default, and
decodes). `dimensions` must equal the model's hidden size: vectors are never shortened (no matryoshka truncation).

Refused with a 400 naming the field, before anything runs: more inputs than the server's prompts-per-request limit
(the one /v1/completions uses), an empty input (empty string, empty list, empty token list), a token id outside the
vocabulary, an input longer than the model's context (`context_length_exceeded`), another `dimensions`.
"""

from __future__ import annotations

import base64
import struct
from typing import ClassVar, Literal

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from radixlm.engine.engine_info import EngineInfo
from radixlm.pooling_params import PoolingParams
from radixlm.server.errors import APIError
from radixlm.server.prompt_result import PromptResult
from radixlm.server.request_bodies import RequestBody
from radixlm.server.serving import OpenAIServing, new_request_id

MAX_INPUT_ENTRIES = 131_072  # entries of `input` (texts or token ids), counted before any is validated


class EmbeddingRequest(RequestBody):
    """OpenAI's fields (`input`, `model`, `encoding_format`, `dimensions`, `user`) and vLLM's `priority`."""

    MAX_ENTRIES: ClassVar[dict[str, int]] = {"input": MAX_INPUT_ENTRIES}

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    priority: int = Field(0, gt=-(2**31), lt=2**31)  # needs --schedule-policy priority

    def inputs(self) -> list[str] | list[list[int]]:
        """The input as a list of inputs (one string or one token-id list becomes a list of one)."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]  # type: ignore[list-item]
        return self.input  # type: ignore[return-value]


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """The vector as the client asked for it: the floats, or base64 of their little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


class Embeddings(OpenAIServing):
    """The handler; `create` is the FastAPI endpoint."""

    async def create(self, body: EmbeddingRequest, raw_request: Request) -> Response:
        info = self.ready_info()
        self.check_model(body.model)
        self._check_options(body, info)
        inputs = self._inputs(body, info)  # counted before any is tokenized
        where = [f"input {i}" if len(inputs) > 1 else "input" for i in range(len(inputs))]
        prompts = [await self._token_ids(item, info, name) for item, name in zip(inputs, where, strict=True)]
        stream = await self.admit(new_request_id("embd"), prompts, PoolingParams(), body.priority, model=body.model)
        results = await self.collect(raw_request, stream, num_prompts=len(prompts))
        data = [EmbeddingData(index=i, embedding=encode_vector(_vector(result), body.encoding_format))
                for i, result in enumerate(results)]
        num_tokens = sum(len(prompt) for prompt in prompts)
        response = EmbeddingResponse(data=data, model=self.response_model(body.model),
                                     usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens))
        return JSONResponse(response.model_dump(mode="json"))

    @staticmethod
    def _check_options(body: EmbeddingRequest, info: EngineInfo) -> None:
        if body.dimensions is not None and body.dimensions != info.hidden_size:
            raise APIError(400, f"dimensions {body.dimensions} is not supported: this model's embeddings have "
                                f"{info.hidden_size} dimensions and radixlm does not shorten them (no matryoshka "
                                f"truncation); leave dimensions out or set it to {info.hidden_size}",
                           param="dimensions", code="unsupported_parameter")
        if body.priority != 0 and info.schedule_policy != "priority":
            raise APIError(400, f"priority needs --schedule-policy priority (this server uses "
                                f"{info.schedule_policy!r})", param="priority")

    @staticmethod
    def _inputs(body: EmbeddingRequest, info: EngineInfo) -> list[str] | list[list[int]]:
        """The request's inputs, at least one and at most the server's limit (each is a request of its own)."""
        inputs = body.inputs()
        if not inputs:
            raise APIError(400, "input must not be empty", param="input")
        limit, flag = info.prompts_per_request_limit
        if len(inputs) > limit:
            raise APIError(400, f"input holds {len(inputs)} inputs; one request may hold at most {limit} ({flag})",
                           param="input")
        return inputs

    async def _token_ids(self, item: str | list[int], info: EngineInfo, name: str) -> list[int]:
        """One input's token ids: not empty, inside the vocabulary, within the context."""
        if isinstance(item, str):
            token_ids = await self.encode(info, item, True, param="input") if item else []
        else:
            bad = [t for t in item if not 0 <= t < info.vocab_size]
            if bad:
                raise APIError(400, f"{name} holds token id {bad[0]}, outside the vocabulary "
                                    f"[0, {info.vocab_size})", param="input")
            token_ids = list(item)
        if not token_ids:
            raise APIError(400, f"{name} is empty; every input needs at least one token", param="input")
        if len(token_ids) > info.max_model_len:
            raise APIError(400, f"This model's maximum context length is {info.max_model_len} tokens. However, you "
                                f"requested {len(token_ids)} tokens in the {name} for embedding generation. Please "
                                f"reduce the length of the input.", param="input", code="context_length_exceeded")
        return token_ids


def _vector(result: PromptResult) -> list[float]:
    """A finished input's vector; an input that ended without one was aborted (its client went away)."""
    if result.embedding is None:
        raise APIError(499, "the request was aborted before its embedding was computed", param="input")
    return result.embedding
