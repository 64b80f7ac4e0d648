"""`GET /health` (open without an API key) and Prometheus `GET /metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dlrt.server.state import server_state

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    worker = server_state(request).worker
    return {"status": "ok", "running": worker.running, "waiting": worker.waiting}


@router.get("/metrics")
async def prometheus(request: Request):
    metrics = server_state(request).metrics
    return Response(metrics.render(), media_type=metrics.content_type)
