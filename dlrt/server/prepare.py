"""A request body to a `Job`: the model name checked, the body turned into an `LLM` call
(`protocol`), the server's defaults added, and `LLM.check` run on it, before the request joins
the queue. Every refusal is an `HTTPError` naming the field as the client sent it: a bad prompt
names the prompt field; a request that does not fit the context names block_length, the max
tokens field or the prompt (`_blame`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from dlrt.decoding.options import DecodingOptions, option_name
from dlrt.errors import DlrtError, OptionError, PromptError
from dlrt.server import protocol
from dlrt.server.errors import HTTPError
from dlrt.server.state import ServerState
from dlrt.server.worker import Job

_ids = itertools.count(1)


def check_model(state: ServerState, body: BaseModel) -> None:
    """A 404 for a request naming a model this server does not serve (None: the one)."""
    if body.model is not None and body.model != state.model_name:
        raise HTTPError(404, f"model {body.model!r} does not exist: this server serves "
                             f"{state.model_name!r}", "model")


def prepare(state: ServerState, call: Callable[[Any], protocol.Call], body: BaseModel,
            endpoint: str) -> Job:
    """Validate a request (`call` turns the body into an `LLM` call; `LLM.check`) and return
    its `Job`; a 400 naming the field as the client sent it."""
    where = protocol.prompt_field(body)
    try:
        prompt, chat, options, fields = call(body)
    except PromptError as e:
        raise HTTPError(400, str(e), where) from e
    sent, options = options, {**state.defaults, **options}
    try:
        ids, _ = state.llm.check(prompt, chat=chat, **options)
    except OptionError as e:
        name = option_name(e)
        field = fields.get(name, name)
        message = str(e)
        if name and field != name and message.startswith(name):
            message = field + message[len(name):]  # max_tokens=0 must be >= 1
        raise HTTPError(400, message, field) from e
    except PromptError as e:
        raise HTTPError(400, *_blame(state, e, prompt, chat, options, fields, where,
                                     endpoint)) from e
    except DlrtError as e:
        raise HTTPError(400, str(e)) from e
    # NOTE: the defaults go apart: only what the client sent is named when without effect
    return Job(f"{endpoint[:4]}-{next(_ids)}", ids, sent, endpoint, defaults=state.defaults)


def _blame(state: ServerState, error: PromptError, prompt, chat: bool, options: dict[str, Any],
           fields: dict[str, str], where: str, endpoint: str) -> tuple[str, str]:
    """The message and the field to name when `LLM.check` refused a request with `error`:
    the prompt when it is bad (`LLM.check_input`: image input) or alone fills the context;
    else (prompt + generation do not fit) the block_length the client sent if the request
    fits without it, else the client's max tokens field; with none sent, the max tokens field
    as the server's default (the message says so, and how many fit), or the prompt when not
    even one new token fits after it."""
    llm, message = state.llm, str(error)
    try:
        ids = llm.encode(prompt, chat)
        llm.check_input(ids)
    except DlrtError:
        return message, where
    if len(ids) >= llm.max_model_len:
        return message, where
    if "block_length" in fields:
        rest = {k: v for k, v in options.items() if k != "block_length"}
        if "block_length" in state.defaults:
            rest["block_length"] = state.defaults["block_length"]
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
