"""LoRA adapters over HTTP, in vLLM's shapes: POST /v1/load_lora_adapter {"lora_name", "lora_path"} and
POST /v1/unload_lora_adapter {"lora_name"} (behind `--api-key` with the rest of /v1/), and the adapters' cards in
/v1/models (`parent`: the base model).

A load is checked from the adapter's files before the model worker reads them (`radixlm.engine.lora_registry`):
a bad adapter, a name already loaded, `--max-loras` reached, or LoRA not enabled is a 400 naming the field; an
unload of an adapter that live requests run is a 400 too. The work runs on the engine thread between steps, so
running requests never see a half-loaded adapter.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import Field

from radixlm.data_parallel.engine import DataParallelEngine
from radixlm.engine.async_engine import AsyncEngine, EngineUnavailableError
from radixlm.lora_request import MAX_LORA_NAME_CHARS
from radixlm.server.errors import APIError
from radixlm.server.request_bodies import RequestBody
from radixlm.server.response_bodies import ModelCard

MAX_LORA_PATH_CHARS = 4096


class LoadLoRAAdapterRequest(RequestBody):
    lora_name: str = Field(min_length=1, max_length=MAX_LORA_NAME_CHARS)
    lora_path: str = Field(min_length=1, max_length=MAX_LORA_PATH_CHARS)


class UnloadLoRAAdapterRequest(RequestBody):
    lora_name: str = Field(min_length=1, max_length=MAX_LORA_NAME_CHARS)


def lora_router(async_engine: AsyncEngine | DataParallelEngine, model_name: str) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/load_lora_adapter")
    async def load(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        if body.lora_name == model_name:
            raise APIError(400, f"{body.lora_name!r} is the base model's name", param="lora_name")
        await _run(async_engine.load_lora_adapter(body.lora_name, body.lora_path))
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @router.post("/v1/unload_lora_adapter")
    async def unload(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        await _run(async_engine.unload_lora_adapter(body.lora_name))
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return router


async def _run(change: object) -> None:
    try:
        await change  # type: ignore[misc]
    except EngineUnavailableError as error:
        raise APIError(503, f"{error}; retry later", code="engine_unavailable") from None
    except ValueError as error:  # a bad adapter (AdapterError names the file and the field) or a refused change
        raise APIError(400, str(error), param=getattr(error, "field", "lora_name")) from None


def adapter_cards(async_engine: AsyncEngine | DataParallelEngine, model_name: str, created: int) -> list[ModelCard]:
    """One card per loaded adapter, its base model as `parent` (vLLM's shape)."""
    return [ModelCard(id=name, created=created, root=lora.lora_path, parent=model_name)
            for name, lora in sorted(async_engine.lora_requests.items())]
