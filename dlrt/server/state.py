"""What the route handlers share: one `ServerState` per app, on `app.state.dlrt`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from dlrt.server.metrics import Metrics
from dlrt.server.worker import Worker


@dataclass(frozen=True)
class ServerState:
    """The loaded `LLM` and its `Worker` (one request at a time), the name it is served as,
    the decoding options every request gets unless it sets them (`defaults`, the `dlrt serve`
    flags), the body size limit in bytes, the metrics, and the app's start time (unix
    seconds: `created` of /v1/models)."""

    llm: Any
    worker: Worker
    model_name: str
    defaults: dict[str, Any]
    max_body_bytes: int
    metrics: Metrics
    created: int


def server_state(request: Request) -> ServerState:
    """The `ServerState` of the app serving `request`."""
    return request.app.state.dlrt
