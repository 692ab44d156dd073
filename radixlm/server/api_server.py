"""The OpenAI-compatible HTTP server: an app factory (no module-global state) and `run_server` (uvicorn).

Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings (`embeddings.py`),
POST /v1/responses (and GET / DELETE /v1/responses/{id}:
OpenAI's Responses API, `openai_responses/`), POST /v1/messages (and /v1/messages/count_tokens:
Anthropic's Messages API), GET /v1/models (and /v1/models/{id}), POST /tokenize,
POST /detokenize (all behind `--api-key` when set, checked before the body is read), GET/HEAD /health (503 until
the engine is ready), GET /metrics (Prometheus). The server answers while the model loads; SIGINT/SIGTERM end every
running request with an error, then exit. Tokenizer work runs on the app's tokenizer thread (`tokenization.py`),
never on the event loop. Slow clients are bounded: headers within 10 s (`http_protocol.py`), the body within 60 s
(`middleware.py`), idle keep-alive connections close after 5 s (uvicorn); `ServerOptions` holds these.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from types import FrameType

import uvicorn
from fastapi import APIRouter, FastAPI, Response
from fastapi.responses import JSONResponse

from radixlm.config import DEFAULT_MODEL
from radixlm.data_parallel.engine import DataParallelEngine, replica_engine_options
from radixlm.engine.async_engine import AsyncEngine
from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.metrics import CONTENT_TYPE, EngineMetrics, ScrapeSample, read_on_scrape
from radixlm.server.anthropic_messages import AnthropicMessages
from radixlm.server.api_key import check_api_key
from radixlm.server.chat import ChatCompletions
from radixlm.server.chat_options import ChatOptions
from radixlm.server.chat_template import check_template_kwargs
from radixlm.server.completions import Completions
from radixlm.server.dashboard import dashboard_router
from radixlm.server.embeddings import Embeddings
from radixlm.server.errors import APIError, BodySizeLimit, install_error_handlers
from radixlm.server.http_protocol import DEFAULT_HEADER_TIMEOUT, HeaderTimeoutH11Protocol
from radixlm.server.lora_routes import adapter_cards, lora_router
from radixlm.server.middleware import APIKeyCheck, BodyReadTimeout, ErrorBoundary, ReleaseMemoryAfterBigBodies
from radixlm.server.openai_responses import OpenAIResponses
from radixlm.server.openai_responses.store import DEFAULT_MAX_BYTES as DEFAULT_STORE_BYTES
from radixlm.server.openai_responses.store import ResponseStore
from radixlm.server.request_bodies import DetokenizeRequest, TokenizeRequest
from radixlm.server.request_ids import RequestIdHeader
from radixlm.server.response_bodies import DetokenizeResponse, ModelCard, ModelList, TokenizeResponse
from radixlm.server.serving import OpenAIServing
from radixlm.server.tokenization import Tokenization
from radixlm.server.tool_calling import check_tools

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
SHUTDOWN_JOIN_SECONDS = 30.0
DEFAULT_BODY_TIMEOUT = 60.0  # 16 MiB in 60 s is 280 KB/s: slower clients are not served
KEEP_ALIVE_TIMEOUT = 5  # seconds (uvicorn's default, made explicit)
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


@dataclass(frozen=True)
class ServerOptions:
    """The HTTP side of `radixlm serve` (the engine side is EngineConfig)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    log_level: str = "warning"
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    responses_store_bytes: int = DEFAULT_STORE_BYTES
    chat: ChatOptions = field(default_factory=ChatOptions)

    def __post_init__(self) -> None:
        if self.api_key is not None:
            check_api_key(self.api_key)


def create_app(engine_factory: Callable[[], LLMEngine] | Sequence[Callable[[], LLMEngine]], model_name: str,
               model_path: str | None = None, api_key: str | None = None,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, body_timeout: float = DEFAULT_BODY_TIMEOUT,
               chat_options: ChatOptions | None = None, responses_store_bytes: int = DEFAULT_STORE_BYTES) -> FastAPI:
    """A FastAPI app serving one engine, built by `engine_factory` in the engine thread at startup; a sequence of
    factories builds one engine replica each, behind a cache-aware router (data parallelism).

    `app.state.async_engine` is the app's AsyncEngine or DataParallelEngine (its `shutdown()` is what
    SIGINT/SIGTERM call).
    """
    async_engine: AsyncEngine | DataParallelEngine
    if callable(engine_factory):
        async_engine = AsyncEngine(engine_factory, EngineMetrics(model_name))
    else:
        async_engine = DataParallelEngine(engine_factory, model_name)
    tokenization = Tokenization()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start(asyncio.get_running_loop())
        yield
        async_engine.shutdown()
        await asyncio.to_thread(async_engine.join, SHUTDOWN_JOIN_SECONDS)
        tokenization.shutdown()

    app = FastAPI(title="radixlm", lifespan=lifespan)
    # Outermost last: ErrorBoundary sees everything, the key is checked before the body is read or limited.
    app.add_middleware(BodyReadTimeout, seconds=body_timeout)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)
    app.add_middleware(ReleaseMemoryAfterBigBodies)
    app.add_middleware(APIKeyCheck, api_key=api_key, protected_prefixes=PROTECTED_PREFIXES)
    app.add_middleware(ErrorBoundary)
    app.add_middleware(RequestIdHeader)  # outside the boundary: a 500 carries the id too
    app.state.async_engine = async_engine
    install_error_handlers(app)
    store = ResponseStore(max_bytes=responses_store_bytes)
    read_on_scrape(async_engine.metrics.registry, {"model_name": model_name}, partial(_store_samples, store))
    app.include_router(_api_router(async_engine, tokenization, model_name, model_path or model_name,
                                   chat_options or ChatOptions(), store))

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        reason = async_engine.unavailable_reason
        if reason is not None:
            return APIError(503, reason, code="engine_unavailable").response()
        return JSONResponse({"status": "ok"})

    app.include_router(dashboard_router(async_engine.metrics, model_name))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(async_engine.metrics.render(), media_type=CONTENT_TYPE)

    return app


def _store_samples(store: ResponseStore) -> list[ScrapeSample]:
    return [ScrapeSample("gauge", "radixlm:responses_store_bytes", "Bytes of stored /v1/responses (JSON text).",
                         store.num_bytes),
            ScrapeSample("gauge", "radixlm:responses_store_budget_bytes",
                         "The response store's budget (--responses-store-bytes).", store.max_bytes)]


def _api_router(async_engine: AsyncEngine | DataParallelEngine, tokenization: Tokenization, model_name: str,
                model_path: str, chat_options: ChatOptions, store: ResponseStore) -> APIRouter:
    router = APIRouter()
    serving = OpenAIServing(async_engine, model_name, tokenization, chat_options)
    router.add_api_route("/v1/chat/completions",
                         ChatCompletions(async_engine, model_name, tokenization, chat_options).create,
                         methods=["POST"])
    router.add_api_route("/v1/completions", Completions(async_engine, model_name, tokenization).create,
                         methods=["POST"])
    router.add_api_route("/v1/embeddings", Embeddings(async_engine, model_name, tokenization).create,
                         methods=["POST"])
    responses = OpenAIResponses(ChatCompletions(async_engine, model_name, tokenization, chat_options), store)
    router.add_api_route("/v1/responses", responses.create, methods=["POST"])
    router.add_api_route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"])
    router.add_api_route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"])
    messages = AnthropicMessages(ChatCompletions(async_engine, model_name, tokenization, chat_options))
    router.add_api_route("/v1/messages", messages.create, methods=["POST"])
    router.add_api_route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"])
    router.include_router(lora_router(async_engine, model_name))
    created = int(time.time())

    def card() -> ModelCard:
        info = async_engine.info
        return ModelCard(id=model_name, created=created, root=model_path,
                         max_model_len=info.max_model_len if info else None)

    @router.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[card(), *adapter_cards(async_engine, model_name, created)])

    @router.get("/v1/models/{model_id:path}")  # a served name may hold "/" (a directory's path)
    async def model(model_id: str) -> ModelCard:
        if serving.check_model(model_id) is not None:
            return next(c for c in adapter_cards(async_engine, model_name, created) if c.id == model_id)
        return card()

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        info = serving.ready_info()
        serving.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", param="prompt")
        if body.messages is not None:
            try:
                if body.tools is not None:
                    check_tools(body.tools)
                template_kwargs = check_template_kwargs(body.chat_template_kwargs)
            except ValueError as error:
                raise APIError.bad_value(error) from None
            tokens = await serving.chat_prompt(info, body.messages, body.add_generation_prompt, body.tools,
                                               template_kwargs)
        else:
            tokens = await serving.encode(info, body.prompt, body.add_special_tokens, param="prompt")
        return TokenizeResponse(count=len(tokens), max_model_len=info.max_model_len, tokens=tokens)

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        info = serving.ready_info()
        serving.check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < info.vocab_size]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {info.vocab_size})",
                           param="tokens")
        return DetokenizeResponse(prompt=await serving.decode(info, body.tokens))

    return router


class _GracefulServer(uvicorn.Server):
    """uvicorn waits for open responses before it stops; fail the engine's requests first so that none hangs.
    A failed engine (a model that does not load, a crashed step) stops the server too."""

    def __init__(self, config: uvicorn.Config, async_engine: AsyncEngine | DataParallelEngine) -> None:
        super().__init__(config)
        self.async_engine = async_engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.async_engine.shutdown("the server is shutting down")
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.async_engine.failure is not None:
            self.should_exit = True
        return await super().on_tick(counter)


def run_server(engine_options: dict[str, object], options: ServerOptions) -> bool:
    """Serve until SIGINT/SIGTERM; returns False if the engine failed (e.g. the model did not load)."""
    model = str(engine_options.get("model") or DEFAULT_MODEL)
    model_name = str(engine_options.get("served_model_name") or model)
    num_replicas = int(engine_options.get("data_parallel_size") or 1)  # type: ignore[call-overload]
    factory: Callable[[], LLMEngine] | list[Callable[[], LLMEngine]] = partial(build_engine, **engine_options)
    if num_replicas > 1:
        factory = [partial(build_engine, **replica_engine_options(engine_options, i)) for i in range(num_replicas)]
    app = create_app(factory, model_name, model_path=model,
                     api_key=options.api_key, max_request_bytes=options.max_request_bytes,
                     body_timeout=options.body_timeout, chat_options=options.chat,
                     responses_store_bytes=options.responses_store_bytes)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level=options.log_level.lower(),
                            timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
                            http=HeaderTimeoutH11Protocol.with_header_timeout(options.header_timeout))
    print(f"radixlm: serving {model_name!r} at http://{options.host}:{options.port} "
          f"(GET /health answers 200 once the model has loaded)", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises Ctrl-C after its graceful shutdown
        _GracefulServer(config, app.state.async_engine).run()
    return app.state.async_engine.failure is None
