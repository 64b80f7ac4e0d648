"""The FastAPI application: NDJSON `/generate`, OpenAI-compatible `/v1/chat/completions`,
`/v1/completions`, `/v1/models`, vLLM's `/tokenize` and `/detokenize`, Prometheus `/metrics`,
and `/health`. With an API key every endpoint but `/health` needs `Authorization: Bearer KEY`.

Bad input never reaches the model and never gets a 5xx: the body is read with a size limit,
decoded as UTF-8 JSON, validated strictly, and checked by `LLM.check` (options, prompt, context)
before the request joins the queue; each failure is a 4xx JSON error naming the field.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from dlrt.decoding.options import DecodingOptions, option_name
from dlrt.errors import DlrtError, OptionError, PromptError
from dlrt.server import protocol
from dlrt.server.auth import RequireKey
from dlrt.server.metrics import CountResponses, Metrics
from dlrt.server.worker import Job, QueueFull, Worker

_ids = itertools.count(1)


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def _error(status: int, message: str, param: str | None = None, headers=None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def _sent_path(err: dict[str, Any], data: Any) -> list[str | int]:
    """The part of a pydantic error location that exists in the body the client sent (plus a
    missing field's name): the tags pydantic adds for the members of a union
    (`stop.int`, `stop.list[union[int,str]].0.str`) are left out."""
    loc = err["loc"]
    path: list[str | int] = [loc[0]]
    node = data.get(loc[0]) if isinstance(data, dict) else None
    for i, part in enumerate(loc[1:], 1):
        if isinstance(node, dict) and isinstance(part, str) and (
                part in node or (err["type"] == "missing" and i == len(loc) - 1)):
            node = node.get(part)
        elif (isinstance(node, list) and isinstance(part, int) and not isinstance(part, bool)
              and 0 <= part < len(node)):
            node = node[part]
        else:
            break
        path.append(part)
    return path


def _invalid(e: ValidationError, data: Any) -> HTTPError:
    """A 400 naming the field the client sent, for the first validation error."""
    errors = e.errors()
    path = _sent_path(errors[0], data)
    param = ".".join(str(x) for x in path)
    n = len(path)
    # a union: one error per member type, each under its tag (the part after the field)
    tags = list(dict.fromkeys(str(err["loc"][n]) for err in errors
                              if len(err["loc"]) > n and list(err["loc"][:n]) == path))
    if len(tags) > 1:
        return HTTPError(400, f"{param}: expected one of {', '.join(tags)}", param=param)
    return HTTPError(400, f"{param}: {errors[0]['msg']}", param=param)


async def _body(request: Request, model, limit: int):
    """Read, decode and validate a JSON body; HTTPError (4xx) on any problem."""
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > limit):
        raise HTTPError(413, f"request body larger than {limit} bytes")
    raw = b""
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise HTTPError(413, f"request body larger than {limit} bytes")
    except ClientDisconnect as e:  # the client left mid-body: nobody reads the answer
        raise HTTPError(400, "the client disconnected before sending the whole body") from e
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise HTTPError(400, f"request body is not valid UTF-8: {e}") from e
    except json.JSONDecodeError as e:
        raise HTTPError(400, f"request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise HTTPError(400, "request body is not valid JSON: nested too deeply") from e
    except ValueError as e:  # an integer past Python's int-string conversion limit
        why = (f"an integer has more than {sys.get_int_max_str_digits()} digits"
               if "integer string conversion" in str(e) else str(e))
        raise HTTPError(400, f"request body is not valid JSON: {why}") from e
    if not isinstance(data, dict):
        raise HTTPError(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _invalid(e, data) from e


def create_app(llm, worker: Worker, model_name: str, defaults: dict[str, Any] | None = None,
               max_body_bytes: int = 1 << 20, api_key: str | None = None) -> FastAPI:
    """The server app around a loaded `LLM`, serving it as `model_name`. `defaults` are decoding
    options applied to every request unless it sets them (the `dlrt serve` flags); `api_key`:
    the key every endpoint but /health asks for (None: none)."""
    app = FastAPI(title="dlrt", version="0.1.0")
    defaults = dict(defaults or {})
    created = int(time.time())
    metrics = Metrics(worker)

    @app.exception_handler(HTTPError)
    async def _http_error(_request, e: HTTPError):
        return _error(e.status, e.message, e.param, e.headers)

    def check_model(body) -> None:
        """A 404 for a request naming a model this server does not serve (None: the one)."""
        if body.model is not None and body.model != model_name:
            raise HTTPError(404, f"model {body.model!r} does not exist: this server serves "
                                 f"{model_name!r}", "model")

    def prepare(call, body, endpoint: str) -> Job:
        """Validate a request (`LLM.check`); a 400 naming the field as the client sent it."""
        where = protocol.prompt_field(body)
        try:
            prompt, chat, options, fields = call(body)
        except PromptError as e:
            raise HTTPError(400, str(e), where) from e
        options = {**defaults, **options}
        options.setdefault("seed", random.randrange(2**31))  # same seed on every rank
        try:
            ids, _ = llm.check(prompt, chat=chat, **options)
        except OptionError as e:
            name = option_name(e)
            field = fields.get(name, name)
            message = str(e)
            if name and field != name and message.startswith(name):
                message = field + message[len(name):]  # max_tokens=0 must be >= 1
            raise HTTPError(400, message, field) from e
        except PromptError as e:
            raise HTTPError(400, *_prompt_blame(e, prompt, chat, options, fields, where,
                                                endpoint)) from e
        except DlrtError as e:
            raise HTTPError(400, str(e)) from e
        return Job(f"{endpoint[:4]}-{next(_ids)}", ids, options, endpoint)

    def _prompt_blame(error: PromptError, prompt, chat, options, fields, where: str,
                      endpoint: str) -> tuple[str, str]:
        """The message and the field to name when `LLM.check` refused a request with `error`:
        the prompt when it is bad or alone fills the context; else (prompt + generation do not
        fit) the block_length the client sent if the request fits without it, else the
        client's max tokens field; with none sent, the max tokens field as the server's
        default (the message says so, and how many fit), or the prompt when not even one new
        token fits after it."""
        message = str(error)
        try:
            ids = llm.encode(prompt, chat)
        except DlrtError:
            return message, where
        if len(ids) >= llm.max_model_len:
            return message, where
        if "block_length" in fields:
            rest = {k: v for k, v in options.items() if k != "block_length"}
            if "block_length" in defaults:
                rest["block_length"] = defaults["block_length"]
            try:
                llm.check(ids, **rest)
                return message, "block_length"
            except DlrtError:
                pass
        if "max_new_tokens" in fields:
            return message, fields["max_new_tokens"]
        try:
            default = llm.resolve(DecodingOptions.from_kwargs(options)).max_new_tokens
            fit = llm.max_new_tokens_fit(len(ids), **options)
        except DlrtError:
            return message, where
        if fit < 1:
            return message, where
        field = "max_new_tokens" if endpoint == "generate" else "max_tokens"
        return (f"{field} is not set and the server's default ({default}) does not fit: "
                f"{message}; at most {fit} new tokens fit after this prompt: set {field} to at "
                f"most {fit}"), field

    async def start(job: Job):
        """Enter the queue; the first event is awaited here so 503s stay HTTP errors."""
        events = worker.run(job)
        try:
            first = await events.__anext__()
        except QueueFull:
            raise HTTPError(503, f"server busy: one request running, {worker.waiting} "
                            f"waiting (--max-queue {worker.max_queue})",
                            headers={"Retry-After": "1"}) from None
        return first, events

    async def chained(first, events):
        metrics.observe(*first)
        yield first
        async for ev in events:
            metrics.observe(*ev)
            yield ev

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": worker.running, "waiting": worker.waiting}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "dlrt"}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    def need_tokenizer(field: str) -> None:
        if llm.tokenizer is None:
            raise HTTPError(400, "this checkpoint has no tokenizer: send and read token ids",
                            field)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await _body(request, protocol.TokenizeRequest, max_body_bytes)
        check_model(body)
        try:
            prompt, field = body.prompt_and_field()
            need_tokenizer(field)
            ids = llm.encode(prompt)
        except PromptError as e:
            raise HTTPError(400, str(e), protocol.prompt_field(body)) from e
        return {"tokens": ids, "count": len(ids), "max_model_len": llm.max_model_len}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _body(request, protocol.DetokenizeRequest, max_body_bytes)
        check_model(body)
        need_tokenizer("tokens")
        try:
            ids = llm.encode(body.tokens) if body.tokens else []
        except PromptError as e:
            raise HTTPError(400, str(e), "tokens") from e
        return {"prompt": llm.tokenizer.decode(ids)}

    @app.post("/generate")
    async def generate(request: Request):
        body = await _body(request, protocol.GenerateRequest, max_body_bytes)
        job = prepare(protocol.generate_call, body, "generate")
        first, events = await start(job)

        async def lines():
            async for kind, payload in chained(first, events):
                if kind == "block":
                    row = {"type": "block", "index": payload.index,
                           "token_ids": payload.token_ids, "text": payload.text,
                           "rounds": payload.rounds}
                elif kind == "final":
                    row = {"type": "final", **payload}
                else:
                    row = {"type": "error", "message": payload}
                yield json.dumps(row, ensure_ascii=False) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def openai(request: Request, model, call, endpoint: str):
        body = await _body(request, model, max_body_bytes)
        check_model(body)
        if llm.tokenizer is None:  # NOTE: the OpenAI answers are text, never token ids
            raise HTTPError(400, f"this checkpoint has no tokenizer and {request.url.path} "
                                 f"answers text: send token ids as input_ids to /generate "
                                 f"(its blocks carry token_ids)", protocol.prompt_field(body))
        if body.stream_options is not None and not body.stream:
            raise HTTPError(400, "stream_options: only with stream: true", "stream_options")
        job = prepare(call, body, endpoint)
        first, events = await start(job)
        chat = endpoint == "chat"
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        obj = "chat.completion" if chat else "text_completion"
        if not body.stream:
            text, final = [], None
            async for kind, payload in chained(first, events):
                if await request.is_disconnected():
                    # NOTE: closing the event stream cancels the generation at the next block.
                    await events.aclose()
                    return _error(499, "client closed the request")
                if kind == "block":
                    text.append(payload.text)
                elif kind == "final":
                    final = payload
                else:
                    return _error(500, f"generation failed: {payload}")
            content = "".join(text)
            choice = ({"index": 0, "message": {"role": "assistant", "content": content}}
                      if chat else {"index": 0, "text": content, "logprobs": None})
            choice["finish_reason"] = final["finish_reason"]
            return {"id": rid, "object": obj, "created": int(time.time()),
                    "model": model_name, "choices": [choice], "usage": _usage(final)}

        def chunk(delta: str | None, finish=None, role=False, usage=None, choices=True) -> str:
            if chat:
                d = {"role": "assistant", "content": ""} if role else (
                    {} if delta is None else {"content": delta})
                choice = {"index": 0, "delta": d, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": finish,
                          "logprobs": None}
            row = {"id": rid, "object": obj + (".chunk" if chat else ""),
                   "created": int(time.time()), "model": model_name,
                   "choices": [choice] if choices else []}
            if usage is not None or include_usage:
                row["usage"] = usage  # NOTE: with include_usage, null but on the last chunk
            return f"data: {json.dumps(row, ensure_ascii=False)}\n\n"

        async def sse():
            if chat:
                yield chunk(None, role=True)
            async for kind, payload in chained(first, events):
                if kind == "block":
                    if payload.text:
                        yield chunk(payload.text)
                elif kind == "final" and include_usage:  # as the OpenAI API sends it
                    yield chunk(None, finish=payload["finish_reason"])
                    yield chunk(None, usage=_usage(payload), choices=False)
                elif kind == "final":  # no usage unless asked for, as the OpenAI API does
                    yield chunk(None, finish=payload["finish_reason"])
                else:
                    yield f"data: {json.dumps({'error': {'message': payload}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await openai(request, protocol.ChatRequest, protocol.chat_call, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await openai(request, protocol.CompletionRequest, protocol.completion_call,
                            "completion")

    paths = frozenset(route.path for route in app.routes)
    if api_key:
        app.add_middleware(RequireKey, key=api_key,
                           unauthorized=lambda: _error(401, "a valid API key is required: "
                                                            "Authorization: Bearer <key>",
                                                       headers={"WWW-Authenticate": "Bearer"}))
    app.add_middleware(CountResponses, metrics=metrics, paths=paths)  # outermost: counts 401s
    return app


def _usage(final: dict[str, Any]) -> dict[str, int]:
    p, c = final["prompt_tokens"], final["completion_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
