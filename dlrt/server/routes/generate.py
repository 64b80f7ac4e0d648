"""`POST /generate`: a prompt, chat messages or token ids plus any decoding option; streams
NDJSON, one line per decided block (`index`, `token_ids`, `text`, `rounds`), then a final line
(finish reason, token counts, TPS, timings) or an error line."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from dlrt.server import protocol
from dlrt.server.body import read_body
from dlrt.server.events import start
from dlrt.server.prepare import prepare
from dlrt.server.state import server_state

router = APIRouter()


@router.post("/generate")
async def generate(request: Request):
    state = server_state(request)
    body = await read_body(request, protocol.GenerateRequest, state.max_body_bytes)
    events = await start(state, prepare(state, protocol.generate_call, body, "generate"))

    async def lines():
        async for kind, payload in events:
            if kind == "block":
                row = {"type": "block", "index": payload.index, "token_ids": payload.token_ids,
                       "text": payload.text, "rounds": payload.rounds}
            elif kind == "final":
                row = {"type": "final", **payload}
            else:
                row = {"type": "error", "message": payload}
            yield json.dumps(row, ensure_ascii=False) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
