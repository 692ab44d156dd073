"""`GET /dashboard`: a live view of the engine, one self-contained page (plain HTML, CSS and JS, no CDN) that polls
`GET /dashboard/data`: the samples the engine thread records after each loop (`EngineMetrics.recent`: queues, KV
and prefix-cache usage, hit rate, tokens generated, the last step's tokens and time, the radix tree's size)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse

from radixlm.metrics import EngineMetrics

MAX_SAMPLES_PER_POLL = 600


def dashboard_router(metrics: EngineMetrics, model_name: str) -> APIRouter:
    router = APIRouter()
    page = files("radixlm.server").joinpath("dashboard.html").read_text(encoding="utf-8")

    @router.get("/dashboard", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page)

    @router.get("/dashboard/data")
    async def dashboard_data(since: float = 0.0) -> JSONResponse:
        """Samples newer than `since` (unix seconds), the most recent `MAX_SAMPLES_PER_POLL` of them."""
        samples = [sample for sample in tuple(metrics.recent) if sample["time"] > since]
        return JSONResponse({"model": model_name, "samples": samples[-MAX_SAMPLES_PER_POLL:]})

    return router
