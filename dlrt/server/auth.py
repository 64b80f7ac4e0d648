"""The API key: every endpoint but `/health` needs `Authorization: Bearer KEY` or `x-api-key:
KEY` (Anthropic's header; ASGI middleware; the scheme's case does not matter, RFC 7235); the
key is compared in constant time and never logged."""

from __future__ import annotations

import hmac

OPEN_PATHS = frozenset({"/health"})


class RequireKey:
    """ASGI middleware: a 401 (`unauthorized(path)`: the error response for that path) for a
    request to any path but `OPEN_PATHS` that carries neither `Authorization: Bearer <key>`
    nor `x-api-key: <key>`."""

    def __init__(self, app, key: str, unauthorized):
        self.app = app
        self._expected = key.encode("utf-8")
        self._unauthorized = unauthorized

    def _allows(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given, self._expected):
            return True
        given = headers.get(b"x-api-key")
        return given is not None and hmac.compare_digest(given, self._expected)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            if not self._allows(dict(scope["headers"])):
                return await self._unauthorized(scope["path"])(scope, receive, send)
        await self.app(scope, receive, send)
