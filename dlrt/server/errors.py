"""HTTP errors in the OpenAI error shape: `{"error": {"message", "type", "param", "code"}}`
(type "invalid_request_error" for a 4xx, "server_error" for a 5xx)."""

from __future__ import annotations

from fastapi.responses import JSONResponse


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
