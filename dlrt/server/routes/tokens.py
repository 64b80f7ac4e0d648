"""vLLM's `POST /tokenize` (text, or chat messages through the chat template, to token ids)
and `POST /detokenize` (token ids to text)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from dlrt.errors import PromptError
from dlrt.server import protocol
from dlrt.server.body import read_body
from dlrt.server.errors import HTTPError
from dlrt.server.prepare import check_model
from dlrt.server.state import ServerState, server_state

router = APIRouter()


def _need_tokenizer(state: ServerState, field: str) -> None:
    if state.llm.tokenizer is None:
        raise HTTPError(400, "this checkpoint has no tokenizer: send and read token ids",
                        field)


@router.post("/tokenize")
async def tokenize(request: Request):
    state = server_state(request)
    body = await read_body(request, protocol.TokenizeRequest, state.max_body_bytes)
    check_model(state, body)
    try:
        prompt, field = body.prompt_and_field()
        _need_tokenizer(state, field)
        ids = state.llm.encode(prompt)
    except PromptError as e:
        raise HTTPError(400, str(e), protocol.prompt_field(body)) from e
    return {"tokens": ids, "count": len(ids), "max_model_len": state.llm.max_model_len}


@router.post("/detokenize")
async def detokenize(request: Request):
    state = server_state(request)
    body = await read_body(request, protocol.DetokenizeRequest, state.max_body_bytes)
    check_model(state, body)
    _need_tokenizer(state, "tokens")
    try:
        ids = state.llm.encode(body.tokens) if body.tokens else []
    except PromptError as e:
        raise HTTPError(400, str(e), "tokens") from e
    return {"prompt": state.llm.tokenizer.decode(ids)}
