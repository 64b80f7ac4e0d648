"""The OpenAI-compatible endpoints: `GET /v1/models`, `GET /v1/models/{id}`,
`POST /v1/chat/completions` and `POST /v1/completions`, each a whole answer or, with
`"stream": true`, server-sent events (`stream_options.include_usage` adds a last chunk with the
usage, as the OpenAI API sends it). `n` choices run one after another (`choices`); a streamed
answer sends each choice's chunks in turn, under its `index`; the usage counts the prompt once
and the tokens of every choice. Their answers are text: a checkpoint without a tokenizer gets a
400. With logprobs (chat: `logprobs: true` and `top_logprobs`; completions: `logprobs: k`) each
choice, and each streamed chunk for the tokens it adds, carries `logprobs` in the OpenAI API's
shape (`dlrt.server.logprobs`); else `logprobs` is null."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from dlrt.outputs import TokenLogprob
from dlrt.server import protocol
from dlrt.server.body import read_body
from dlrt.server.choices import choice_runs
from dlrt.server.errors import HTTPError, error_response
from dlrt.server.events import Event, start
from dlrt.server.logprobs import TokenText
from dlrt.server.prepare import check_model, prepare
from dlrt.server.state import ServerState, server_state

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [_model(server_state(request))]}


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str):
    """The served model (the `openai` client's `models.retrieve`); any other id: 404."""
    state = server_state(request)
    if model_id != state.model_name:
        raise HTTPError(404, f"model {model_id!r} does not exist: this server serves "
                             f"{state.model_name!r}", "model")
    return _model(state)


def _model(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "dlrt"}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    return await _complete(request, protocol.ChatRequest, protocol.chat_call, "chat")


@router.post("/v1/completions")
async def completions(request: Request):
    return await _complete(request, protocol.CompletionRequest, protocol.completion_call,
                           "completion")


async def _complete(request: Request, model: type[BaseModel],
                    call: Callable[[Any], protocol.Call], endpoint: str):
    state = server_state(request)
    body = await read_body(request, model, state.max_body_bytes)
    check_model(state, body)
    if state.llm.tokenizer is None:  # NOTE: the OpenAI answers are text, never token ids
        raise HTTPError(400, f"this checkpoint has no tokenizer and {request.url.path} "
                             f"answers text: send token ids as input_ids to /generate "
                             f"(its blocks carry token_ids)", protocol.prompt_field(body))
    if body.stream_options is not None and not body.stream:
        raise HTTPError(400, "stream_options: only with stream: true", "stream_options")
    job = prepare(state, call, body, endpoint)
    job.runs = choice_runs(state, job, body.n or 1)
    events = await start(state, job)
    answer = _Answer(state.model_name, chat=endpoint == "chat", include_usage=(
        body.stream_options is not None and body.stream_options.include_usage),
        text=TokenText(state.llm.tokenizer), n=len(job.runs))
    if not body.stream:
        return await _whole(request, events, answer)
    return StreamingResponse(_sse(events, answer), media_type="text/event-stream")


@dataclass
class _Answer:
    """The shapes of one answer: a whole completion, or its streamed chunks (`offsets[i]`:
    the completions' text_offset choice i reached so far)."""

    model_name: str
    chat: bool
    include_usage: bool
    text: TokenText
    n: int = 1
    rid: str = field(init=False)
    offsets: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.rid = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def logprobs(self, items: list[TokenLogprob] | None, index: int = 0
                 ) -> dict[str, Any] | None:
        """Choice `index`'s `logprobs` for the tokens `items` (None: not asked for)."""
        if items is None:
            return None
        if self.chat:
            return self.text.chat(items)
        out = self.text.completion(items, self.offsets.get(index, 0))
        self.offsets[index] = self.offsets.get(index, 0) + sum(len(t) for t in out["tokens"])
        return out

    def whole(self, contents: list[str], finals: list[dict[str, Any]],
              logprobs: list[list[TokenLogprob] | None]) -> dict[str, Any]:
        """The answer of every choice: `contents[i]`, `finals[i]` and `logprobs[i]` of
        choice i."""
        choices = []
        for i, (content, final, items) in enumerate(zip(contents, finals, logprobs,
                                                        strict=True)):
            choice = ({"index": i, "message": {"role": "assistant", "content": content}}
                      if self.chat else {"index": i, "text": content})
            choice["logprobs"] = self.logprobs(items, i)
            choice["finish_reason"] = final["finish_reason"]
            choices.append(choice)
        return {"id": self.rid, "object": self.object, "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": _usage(finals)}

    def chunk(self, delta: str | None, finish=None, role: bool = False,
              usage: dict[str, int] | None = None, choices: bool = True,
              logprobs: list[TokenLogprob] | None = None, index: int = 0) -> str:
        if self.chat:
            d = {"role": "assistant", "content": ""} if role else (
                {} if delta is None else {"content": delta})
            choice = {"index": index, "delta": d, "logprobs": self.logprobs(logprobs, index),
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": delta or "", "finish_reason": finish,
                      "logprobs": self.logprobs(logprobs, index)}
        row = {"id": self.rid, "object": self.object + (".chunk" if self.chat else ""),
               "created": int(time.time()), "model": self.model_name,
               "choices": [choice] if choices else []}
        if usage is not None or self.include_usage:
            row["usage"] = usage  # NOTE: with include_usage, null but on the last chunk
        return f"data: {json.dumps(row, ensure_ascii=False)}\n\n"


async def _whole(request: Request, events: AsyncIterator[Event], answer: _Answer):
    texts, finals = [[]], []  # texts[i]: the blocks' text of choice i
    logprobs: list[list[TokenLogprob] | None] = [None]  # logprobs[i]: choice i's, if asked
    async for kind, payload in events:
        if await request.is_disconnected():
            # NOTE: closing the event stream cancels the generation at the next block.
            await events.aclose()
            return error_response(499, "client closed the request")
        if kind == "block":
            texts[-1].append(payload.text)
            if payload.logprobs is not None:
                logprobs[-1] = (logprobs[-1] or []) + payload.logprobs
        elif kind == "final":
            finals.append(payload)
            texts.append([])
            logprobs.append(None)
        else:
            return error_response(500, f"generation failed: {payload}")
    return answer.whole(["".join(t) for t in texts[:-1]], finals, logprobs[:-1])


async def _sse(events: AsyncIterator[Event], answer: _Answer) -> AsyncIterator[str]:
    finals: list[dict[str, Any]] = []  # NOTE: choice i's events follow choice i-1's final
    if answer.chat:
        yield answer.chunk(None, role=True)
    async for kind, payload in events:
        index = len(finals)
        if kind == "block":
            # NOTE: a block whose text is held back (part of a character) still sends its
            # tokens' logprobs
            if payload.text or payload.logprobs:
                yield answer.chunk(payload.text, logprobs=payload.logprobs, index=index)
        elif kind == "final":
            finals.append(payload)
            yield answer.chunk(None, finish=payload["finish_reason"], index=index)
            if answer.chat and len(finals) < answer.n:
                yield answer.chunk(None, role=True, index=index + 1)
            elif answer.include_usage and len(finals) == answer.n:  # as the OpenAI API does
                yield answer.chunk(None, usage=_usage(finals), choices=False)
        else:
            yield f"data: {json.dumps({'error': {'message': payload}})}\n\n"
    yield "data: [DONE]\n\n"


def _usage(finals: list[dict[str, Any]]) -> dict[str, int]:
    """The prompt once and the new tokens of every choice."""
    p, c = finals[0]["prompt_tokens"], sum(f["completion_tokens"] for f in finals)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
