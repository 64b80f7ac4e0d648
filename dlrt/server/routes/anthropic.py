"""Anthropic's `POST /v1/messages` (as vLLM serves it): a whole message, or with
`"stream": true` its server-sent events: message_start, content_block_start, a
content_block_delta (text_delta) per decided block, content_block_stop, message_delta (the
stop_reason and the usage), message_stop. `stop_reason` is "end_turn" (a stop token of the
model), "stop_sequence" (with `stop_sequence` the string that stopped it), "max_tokens", or
dlrt's "timeout" / "cancelled". Errors take Anthropic's shape (`errors.error_for`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from dlrt.server.body import read_body
from dlrt.server.errors import HTTPError, anthropic_error
from dlrt.server.events import Event, start
from dlrt.server.prepare import check_model, prepare
from dlrt.server.protocol_anthropic import MessagesRequest, messages_call
from dlrt.server.state import server_state

router = APIRouter()


@router.post("/v1/messages")
async def messages(request: Request):
    state = server_state(request)
    body = await read_body(request, MessagesRequest, state.max_body_bytes)
    check_model(state, body)
    if state.llm.tokenizer is None:  # NOTE: the answer is text, never token ids
        raise HTTPError(400, "this checkpoint has no tokenizer and /v1/messages answers text: "
                             "send token ids as input_ids to /generate", "messages")
    job = prepare(state, messages_call, body, "messages")
    events = await start(state, job)
    message = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
               "model": state.model_name}
    if not body.stream:
        return await _whole(request, events, message)
    return StreamingResponse(_sse(events, message, len(job.prompt_ids)),
                             media_type="text/event-stream")


def _stop(final: dict[str, Any]) -> dict[str, Any]:
    """`stop_reason` and `stop_sequence` of a run's final summary."""
    finish, why = final["finish_reason"], final["stop_reason"]
    if finish == "stop" and isinstance(why, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": why}
    reason = {"stop": "end_turn", "length": "max_tokens"}.get(finish, finish)
    return {"stop_reason": reason, "stop_sequence": None}


async def _whole(request: Request, events: AsyncIterator[Event], message: dict[str, Any]):
    text, final = [], None
    async for kind, payload in events:
        if await request.is_disconnected():
            # NOTE: closing the event stream cancels the generation at the next block.
            await events.aclose()
            return JSONResponse(anthropic_error(499, "client closed the request"), 499)
        if kind == "block":
            text.append(payload.text)
        elif kind == "final":
            final = payload
        else:
            return JSONResponse(anthropic_error(500, f"generation failed: {payload}"), 500)
    return {**message, "content": [{"type": "text", "text": "".join(text)}], **_stop(final),
            "usage": {"input_tokens": final["prompt_tokens"],
                      "output_tokens": final["completion_tokens"]}}


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


async def _sse(events: AsyncIterator[Event], message: dict[str, Any],
               input_tokens: int) -> AsyncIterator[str]:
    yield _event("message_start", {"message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})
    yield _event("content_block_start", {"index": 0, "content_block": {"type": "text",
                                                                        "text": ""}})
    async for kind, payload in events:
        if kind == "block":
            if payload.text:
                yield _event("content_block_delta", {"index": 0, "delta": {
                    "type": "text_delta", "text": payload.text}})
        elif kind == "final":
            yield _event("content_block_stop", {"index": 0})
            yield _event("message_delta", {"delta": _stop(payload), "usage": {
                "input_tokens": payload["prompt_tokens"],
                "output_tokens": payload["completion_tokens"]}})
            yield _event("message_stop", {})
        else:
            yield _event("error", {"error": anthropic_error(500, f"generation failed: "
                                                                 f"{payload}")["error"]})
