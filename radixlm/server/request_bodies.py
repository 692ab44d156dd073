"""OpenAI request bodies as pydantic models, and their mapping onto SamplingParams.

Unknown fields are ignored, as OpenAI does. Fields we know but cannot honour yet (audio, ...) are declared so that
`unsupported_field()` can name them: a request that sets one to anything but its neutral value is refused with 400
rather than silently half-served. Value ranges are checked once, by SamplingParams. Structured-output fields
(response_format, regex, ebnf, choice, ...) map onto one GrammarSpec (`server/structured.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

from radixlm.errors import ParamError
from radixlm.sampling_params import MAX_LOGPROBS, MAX_TOKEN_ID_LIST, SamplingParams
from radixlm.server.json_checks import body_problem
from radixlm.server.structured import GRAMMAR_FIELDS, grammar_from_fields
from radixlm.structured.grammar_spec import GrammarSpec

MAX_MESSAGES = 4096  # per chat request
MAX_CONTENT_PARTS = 1024  # per message
MAX_DETOKENIZE_TOKENS = 131_072


class RequestBody(BaseModel):
    """Base of every request body: text that is not valid Unicode, or nesting deeper than MAX_NESTING, anywhere
    in a field is refused (400) naming the field (`json_checks.py`); so is a list (or object) field with more
    entries than `MAX_ENTRIES` allows it, counted before any entry is validated."""

    model_config = ConfigDict(extra="ignore", strict=True)  # JSON types as sent: true is not 1, "yes" not true
    MAX_ENTRIES: ClassVar[dict[str, int]] = {}
    # Field -> "is this value one the server can honour?": the fields a body declares only to refuse them.
    UNSUPPORTED: ClassVar[dict[str, Callable[[Any], bool]]] = {}

    def unsupported_field(self) -> str | None:
        """The first field set to a value this server cannot honour, or None."""
        for name, is_neutral in self.UNSUPPORTED.items():
            if not is_neutral(getattr(self, name)):
                return name
        return None

    @field_validator("*", mode="before")
    @classmethod
    def _usable_json(cls, value: Any, info: ValidationInfo) -> Any:
        limit = cls.MAX_ENTRIES.get(str(info.field_name))
        if limit is not None and isinstance(value, (list, dict)) and len(value) > limit:
            raise ValueError(f"holds {len(value)} entries; the limit is {limit}")
        problem = body_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


def is_off(value: Any) -> bool:
    """The neutral value of a field declared only to be refused: unset, false or empty."""
    return value is None or value is False or value == [] or value == {}


class StreamOptions(BaseModel):
    """`include_usage` adds a last chunk with the usage; `continuous_usage_stats` (vLLM's) also puts the usage so
    far on every chunk, when `include_usage` is set too (as vLLM reads it)."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingRequest(RequestBody):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    MAX_ENTRIES: ClassVar[dict[str, int]] = {"logit_bias": MAX_TOKEN_ID_LIST, "stop_token_ids": MAX_TOKEN_ID_LIST}

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    best_of: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    priority: int = Field(0, gt=-(2**31), lt=2**31)
    # llama.cpp's: the response and every streamed chunk carry `timings` (prompt and generation times, speeds).
    timings_per_token: bool = False
    # OpenAI's metadata: up to 16 string pairs (keys up to 64 characters, values up to 512), kept on the outputs
    # and in the trace.
    metadata: dict[Annotated[str, StringConstraints(max_length=64)],
                   Annotated[str, StringConstraints(max_length=512)]] | None = Field(None, max_length=16)
    # Structured outputs: at most one of these (see server/structured.py).
    response_format: Any = None
    regex: Any = None
    ebnf: Any = None
    choice: Any = None
    json_schema: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_values(self) -> dict[str, Any]:
        """The SamplingParams fields this request sets; an unset field keeps SamplingParams' default."""
        values = dict(n=self.n, best_of=self.best_of, max_tokens=self.requested_max_tokens(),
                      min_tokens=self.min_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                      min_p=self.min_p, repetition_penalty=self.repetition_penalty,
                      frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty,
                      logit_bias=self.logit_bias, seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
                      include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
                      skip_special_tokens=self.skip_special_tokens,
                      spaces_between_special_tokens=self.spaces_between_special_tokens)
        values = {name: value for name, value in values.items() if value is not None}
        return values | {"max_tokens": self.requested_max_tokens()}  # None: up to the model's context

    def grammar(self) -> tuple[GrammarSpec | None, str | None]:
        """The structured-output constraint and the field that set it; ValueError names a bad field."""
        return grammar_from_fields({name: getattr(self, name) for name in GRAMMAR_FIELDS})

    def to_sampling_params(self, **overrides: Any) -> SamplingParams:
        """Raises ValueError naming the offending field (SamplingParams validates every value)."""
        spec, _ = self.grammar()
        return SamplingParams(**(self.sampling_values() | {"structured_outputs": spec} | overrides))

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options is not None and self.stream_options.continuous_usage_stats


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One message; extra keys (name, tool_calls, tool_call_id, ...) are passed to the chat template as given."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _few_parts(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > MAX_CONTENT_PARTS:
            raise ValueError(f"holds {len(value)} content parts; the limit is {MAX_CONTENT_PARTS}")
        return value


_CHAT_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "functions": is_off,  # the deprecated form of tools: send tools instead
    "function_call": lambda v: v is None or v == "none",
    "audio": is_off,
    "modalities": lambda v: is_off(v) or v == ["text"],
    "prediction": is_off,
    "reasoning_effort": is_off,
    "web_search_options": is_off,
    "echo": is_off,  # vLLM's chat echo; /v1/completions supports echo
}
# A request inside an agent's tool loop gets this priority: below every client value, so it is the last to be
# preempted (and, under --schedule-policy priority, the first to be scheduled).
AGENT_LOOP_PRIORITY = -(2**31)


class ChatCompletionRequest(SamplingRequest):
    UNSUPPORTED: ClassVar[dict[str, Callable[[Any], bool]]] = _CHAT_UNSUPPORTED
    MAX_ENTRIES: ClassVar[dict[str, int]] = {**SamplingRequest.MAX_ENTRIES, "messages": MAX_MESSAGES}

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # radixlm's extension: this request continues an agent's tool loop (default: when its messages hold a tool
    # result); such requests are the last to be preempted.
    agent_loop: bool | None = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    echo: Any = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def in_agent_loop(self) -> bool:
        if self.agent_loop is not None:
            return self.agent_loop
        return any(message.role == "tool" for message in self.messages)

    def engine_priority(self) -> int:
        return AGENT_LOOP_PRIORITY if self.in_agent_loop() else self.priority

    def to_sampling_params(self, **overrides: Any) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParamError("top_logprobs", "requires logprobs to be true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return super().to_sampling_params(logprobs=logprobs, **overrides)


class CompletionRequest(SamplingRequest):
    UNSUPPORTED: ClassVar[dict[str, Callable[[Any], bool]]] = {"suffix": is_off}

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: Any = None

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt as a list of prompts (a single string or token-id list becomes a list of one)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if not self.prompt:
            raise ParamError("prompt", "must not be empty")
        if isinstance(self.prompt[0], int):
            return [self.prompt]  # type: ignore[list-item]
        return self.prompt  # type: ignore[return-value]

    def scores_prompt_only(self) -> bool:
        """`echo` with `max_tokens: 0` (prompt scoring, as OpenAI's legacy API and vLLM serve it): the prompt and
        its logprobs come back and nothing is generated."""
        return self.echo and self.max_tokens == 0

    def to_sampling_params(self, **overrides: Any) -> SamplingParams:
        prompt_logprobs = self.logprobs if self.echo and self.logprobs is not None else None
        if self.scores_prompt_only():  # the engine always generates a token: the handler drops it
            overrides = {"max_tokens": 1} | overrides
        return super().to_sampling_params(logprobs=self.logprobs, prompt_logprobs=prompt_logprobs, **overrides)


class TokenizeRequest(RequestBody):
    """vLLM's /tokenize: a `prompt`, or chat `messages` rendered with the chat template."""

    MAX_ENTRIES: ClassVar[dict[str, int]] = {"messages": MAX_MESSAGES}

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    tools: Any = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(RequestBody):
    MAX_ENTRIES: ClassVar[dict[str, int]] = {"tokens": MAX_DETOKENIZE_TOKENS}

    model: str | None = None
    tokens: list[int]
