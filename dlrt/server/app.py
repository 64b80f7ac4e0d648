"""The FastAPI application: NDJSON `/generate`, OpenAI-compatible `/v1/chat/completions`,
`/v1/completions`, `/v1/models` and `/v1/models/{id}`, Anthropic's `/v1/messages`, vLLM's
`/tokenize` and `/detokenize`, Prometheus `/metrics`, and `/health` (the handlers: `routes/`,
over the `ServerState` on `app.state.dlrt`). With an API key every endpoint but `/health` needs
`Authorization: Bearer KEY` or `x-api-key: KEY`. Every error is a JSON body in the shape of the
path's API (`errors`): FastAPI's own 404, 405 and 422 too.

Bad input never reaches the model and never gets a 5xx: the body is read with a size limit,
decoded as UTF-8 JSON, validated strictly (`body`), and checked by `LLM.check` (options,
prompt, context: `prepare`) before the request joins the queue; each failure is a 4xx JSON
error naming the field.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dlrt.errors import OptionError
from dlrt.server.auth import RequireKey
from dlrt.server.errors import (
    HTTPError,
    error_for,
    http_error_handler,
    is_anthropic,
    starlette_error_handler,
    validation_error_handler,
)
from dlrt.server.metrics import CountResponses, Metrics
from dlrt.server.routes import anthropic, generate, health, openai, tokens
from dlrt.server.state import ServerState
from dlrt.server.worker import Worker

__all__ = ["create_app"]


def create_app(llm, worker: Worker, model_name: str, defaults: dict[str, Any] | None = None,
               max_body_bytes: int = 1 << 20, api_key: str | None = None) -> FastAPI:
    """The server app around a loaded `LLM`, serving it as `model_name`. `defaults` are decoding
    options applied to every request unless it sets them (the `dlrt serve` flags);
    `max_body_bytes`: larger bodies get 413; `api_key`: the key every endpoint but /health
    asks for (None: none).

    Raises:
        OptionError: an empty (or blank) `api_key`: it would ask for nothing.
    """
    if api_key is not None and not api_key.strip():
        raise OptionError("api_key: the key is empty: give a key, or None to ask for none")
    app = FastAPI(title="dlrt", version="0.1.0")
    app.state.dlrt = ServerState(llm=llm, worker=worker, model_name=model_name,
                                 defaults=dict(defaults or {}), max_body_bytes=max_body_bytes,
                                 metrics=Metrics(worker), created=int(time.time()))
    app.add_exception_handler(HTTPError, http_error_handler)
    app.add_exception_handler(StarletteHTTPException, starlette_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    routers = [routes.router for routes in (health, openai, anthropic, tokens, generate)]
    for router in routers:
        app.include_router(router)
    # NOTE: app.routes holds an included router as one entry: its routes are read from it
    paths = frozenset(route.path for router in (app.router, *routers) for route in router.routes
                      if hasattr(route, "path"))
    if api_key:
        app.add_middleware(RequireKey, key=api_key, unauthorized=_unauthorized)
    app.add_middleware(CountResponses, metrics=app.state.dlrt.metrics,
                       paths=paths)  # outermost: counts 401s
    return app


def _unauthorized(path: str):
    """The 401 for a request to `path` without the API key."""
    how = ("x-api-key: <key> (or Authorization: Bearer <key>)" if is_anthropic(path)
           else "Authorization: Bearer <key>")
    return error_for(path, 401, f"a valid API key is required: {how}",
                     headers={"WWW-Authenticate": "Bearer"})
