"""`GET /health` (open without an API key) and Prometheus `GET /metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from dlrt.server.state import server_state

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    """200 {"status": "ok", "running", "waiting"}; 503 {"status": "error", "reason", ...}
    once the model can run no more requests (the server is stopping)."""
    worker = server_state(request).worker
    counts = {"running": worker.running, "waiting": worker.waiting}
    if worker.lost is not None:
        return JSONResponse({"status": "error", "reason": lost_reason(worker.lost), **counts},
                            status_code=503)
    return {"status": "ok", **counts}


def lost_reason(lost: str) -> str:
    """One line: why the server stops (`Worker.lost`)."""
    return f"the model can run no more requests: {lost}"


@router.get("/metrics")
async def prometheus(request: Request):
    metrics = server_state(request).metrics
    return Response(metrics.render(), media_type=metrics.content_type)
