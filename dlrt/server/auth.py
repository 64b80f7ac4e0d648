"""The API key: every endpoint but `/health` needs `Authorization: Bearer KEY` (ASGI
middleware; the scheme's case does not matter, RFC 7235); the key is compared in constant time
and never logged."""

from __future__ import annotations

import hmac

OPEN_PATHS = frozenset({"/health"})


class RequireKey:
    """ASGI middleware: a 401 (the OpenAI error shape, from `unauthorized`) for a request to any
    path but `OPEN_PATHS` whose Authorization header is not `Bearer <key>`."""

    def __init__(self, app, key: str, unauthorized):
        self.app = app
        self._expected = key.encode("utf-8")
        self._unauthorized = unauthorized

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given, self._expected):
                return await self._unauthorized()(scope, receive, send)
        await self.app(scope, receive, send)
