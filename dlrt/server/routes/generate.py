"""`POST /generate`: a prompt, chat messages or token ids plus any decoding option; streams
NDJSON, one line per decided block (`index`, `token_ids`, `text`, `rounds`, `step_map`, and
with `logprobs` its tokens' `logprobs`), then a final line (finish reason, token counts, TPS,
timings, the whole `step_map` and `logprobs`) or an error line."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from dlrt.server import protocol
from dlrt.server.body import read_body
from dlrt.server.events import start
from dlrt.server.logprobs import generate_rows
from dlrt.server.prepare import prepare
from dlrt.server.state import server_state

router = APIRouter()


@router.post("/generate")
async def generate(request: Request):
    state = server_state(request)
    body = await read_body(request, protocol.GenerateRequest, state.max_body_bytes)
    events = await start(state, prepare(state, protocol.generate_call, body, "generate"))

    async def lines():
        step_map, logprobs = [], None
        async for kind, payload in events:
            if kind == "block":
                row = {"type": "block", "index": payload.index, "token_ids": payload.token_ids,
                       "text": payload.text, "rounds": payload.rounds,
                       "step_map": payload.step_map}
                step_map += payload.step_map
                if payload.logprobs is not None:
                    row["logprobs"] = generate_rows(payload.logprobs)
                    logprobs = [] if logprobs is None else logprobs
                    logprobs += row["logprobs"]
            elif kind == "final":
                row = {"type": "final", **payload, "step_map": step_map}
                if logprobs is not None:
                    row["logprobs"] = logprobs
            else:
                row = {"type": "error", "message": payload}
            yield json.dumps(row, ensure_ascii=False) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
