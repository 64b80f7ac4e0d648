"""HTTP errors in the shape of the API a path belongs to: Anthropic's for `/v1/messages`
(`{"type": "error", "error": {"type", "message"}}`, `is_anthropic`), else OpenAI's
(`{"error": {"message", "type", "param", "code"}}`, type "invalid_request_error" for a 4xx,
"server_error" for a 5xx). FastAPI's own errors (an unknown path: 404, a method the path does
not take: 405, a route parameter that does not validate: 422) get the same shapes."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ANTHROPIC_PATH = "/v1/messages"
# Anthropic's error types by HTTP status (others: invalid_request_error for a 4xx, api_error
# for a 5xx)
_ANTHROPIC_TYPES = {401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error", 529: "overloaded_error"}


class HTTPError(Exception):
    """Raised by a handler to answer with `error_response(status, message, param, headers)`."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def anthropic_error(status: int, message: str) -> dict:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_anthropic(path: str) -> bool:
    """Whether `path` belongs to Anthropic's Messages API (its errors take that shape)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def error_for(path: str, status: int, message: str, param: str | None = None,
              headers: dict[str, str] | None = None) -> JSONResponse:
    """The error response in the shape of the API `path` belongs to."""
    if is_anthropic(path):
        if param is not None and not message.startswith(param):
            message = f"{param}: {message}"  # NOTE: Anthropic's shape has no field for it
        return JSONResponse(anthropic_error(status, message), status_code=status,
                            headers=headers)
    return error_response(status, message, param, headers)


async def http_error_handler(request, e: HTTPError) -> JSONResponse:
    """The app's exception handler for `HTTPError`."""
    return error_for(request.url.path, e.status, e.message, e.param, e.headers)


async def starlette_error_handler(request, e: StarletteHTTPException) -> JSONResponse:
    """The app's exception handler for FastAPI's own HTTP errors (404, 405, ...)."""
    method, path = request.method, request.url.path
    if e.status_code == 404:
        message = f"{method} {path}: no such endpoint"
    elif e.status_code == 405:
        allowed = (e.headers or {}).get("Allow") or (e.headers or {}).get("allow")
        message = f"{method} is not allowed on {path}" + (
            f" (allowed: {allowed})" if allowed else "")
    else:
        message = str(e.detail)
    return error_for(path, e.status_code, message, headers=e.headers)


async def validation_error_handler(request, e: RequestValidationError) -> JSONResponse:
    """The app's exception handler for a route parameter that does not validate (422)."""
    first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(x) for x in first["loc"][1:]) or None
    message = f"{param}: {first['msg']}" if param else first["msg"]
    return error_for(request.url.path, 422, message, param)
