"""HTTP errors in the OpenAI error shape: `{"error": {"message", "type", "param", "code"}}`
(type "invalid_request_error" for a 4xx, "server_error" for a 5xx). FastAPI's own errors (an
unknown path: 404, a method the path does not take: 405, a route parameter that does not
validate: 422) get the same shape."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


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


async def http_error_handler(_request, e: HTTPError) -> JSONResponse:
    """The app's exception handler for `HTTPError`."""
    return error_response(e.status, e.message, e.param, e.headers)


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
    return error_response(e.status_code, message, headers=e.headers)


async def validation_error_handler(request, e: RequestValidationError) -> JSONResponse:
    """The app's exception handler for a route parameter that does not validate (422)."""
    first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(x) for x in first["loc"][1:]) or None
    message = f"{param}: {first['msg']}" if param else first["msg"]
    return error_response(422, message, param)
