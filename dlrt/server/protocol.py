"""Request bodies of the HTTP endpoints, validated strictly (pydantic), and their translation to
`LLM` calls. Decoding fields are derived from `DecodingOptions`, so each is declared once."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from dlrt.decoding.options import DecodingOptions
from dlrt.errors import PromptError

_DECODING = frozenset(f.name for f in dataclasses.fields(DecodingOptions))
_STRICT = {int: StrictInt, float: StrictFloat | StrictInt, str: StrictStr, bool: StrictBool}
StopField = StrictInt | StrictStr | list[StrictInt | StrictStr]


def _decoding_fields(skip: tuple[str, ...] = ()) -> dict[str, Any]:
    hints = typing.get_type_hints(DecodingOptions)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(DecodingOptions):
        if f.name in skip:
            continue
        if f.name == "stop":
            out[f.name] = (StopField | None, None)
            continue
        base = next(t for t in (typing.get_args(hints[f.name]) or (hints[f.name],))
                    if t is not type(None))
        out[f.name] = (_STRICT[base] | None, None)
    return out


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: StrictStr
    content: StrictStr | list[dict[str, Any]]
    name: StrictStr | None = None

    def text(self) -> dict[str, str]:
        """As {"role", "content"} with OpenAI content parts joined (text parts only); OpenAI's
        `developer` role is the system role (as vLLM takes it)."""
        role = "system" if self.role == "developer" else self.role
        if isinstance(self.content, str):
            return {"role": role, "content": self.content}
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise PromptError("messages: only text content parts are supported")
            parts.append(part["text"])
        return {"role": role, "content": "".join(parts)}


_Strict = ConfigDict(extra="forbid", strict=True)

GenerateRequest = create_model(
    "GenerateRequest", __config__=_Strict,
    prompt=(StrictStr | None, None), messages=(list[Message] | None, None),
    input_ids=(list[StrictInt] | None, None), chat=(StrictBool, False),
    **_decoding_fields())

_OPENAI_EXTRAS = _decoding_fields(skip=("max_new_tokens", "temperature", "top_p", "seed", "stop",
                                         "logprobs", "top_logprobs"))
MAX_N = 128  # choices per OpenAI request (OpenAI's limit)
MAX_STOP = 4  # stop sequences per OpenAI request (OpenAI's limit)


def accept_only(allowed: tuple[Any, ...], why: str) -> Any:
    """The type of a field taken only as one of `allowed` (or null: not sent); any other
    value is a 400 naming it and saying `why` (what dlrt does not do)."""
    def check(value: Any) -> Any:
        if value is not None and value not in allowed:
            raise PydanticCustomError("unsupported", why)
        return value
    return Annotated[Any, AfterValidator(check)]


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`: `include_usage` adds a last chunk with the usage."""

    model_config = _Strict
    include_usage: StrictBool = False


class _OpenAIBase(BaseModel):
    model_config = _Strict
    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: StrictFloat | StrictInt | None = None
    top_p: StrictFloat | StrictInt | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None
    user: StrictStr | None = None
    presence_penalty: Literal[0, 0.0] | None = None
    frequency_penalty: Literal[0, 0.0] | None = None
    logit_bias: accept_only((), "not supported") = None

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, stop):
        if isinstance(stop, list) and len(stop) > MAX_STOP:
            raise PydanticCustomError("too_long", "at most {most} stop sequences, got {got}",
                                      {"most": MAX_STOP, "got": len(stop)})
        return stop


# Chat fields OpenAI clients send by default, taken as having no effect on the answer; the
# tool and format fields only at their values that ask for nothing dlrt cannot do.
_CHAT_ACCEPTED = dict(
    store=(StrictBool | None, None),
    metadata=(dict[StrictStr, StrictStr] | None, None),
    parallel_tool_calls=(StrictBool | None, None),
    tool_choice=(accept_only(("none",), 'tool calling is not supported: only "none"'), None),
    tools=(accept_only((), "tool calling is not supported"), None),
    response_format=(accept_only(({"type": "text"},), 'only {"type": "text"} is supported'),
                     None),
)

# logprobs: chat takes a boolean and top_logprobs (0..20); completions an int, the number of
# alternatives (the legacy API's `logprobs`)
ChatRequest = create_model(
    "ChatRequest", __base__=_OpenAIBase, messages=(list[Message], Field(min_length=1)),
    max_completion_tokens=(StrictInt | None, None), logprobs=(StrictBool | None, None),
    top_logprobs=(StrictInt | None, None), **_CHAT_ACCEPTED, **_OPENAI_EXTRAS)
CompletionRequest = create_model(
    "CompletionRequest", __base__=_OpenAIBase,
    prompt=(StrictStr | list[StrictInt] | list[StrictStr], ...), echo=(Literal[False], False),
    logprobs=(StrictInt | None, None), **_OPENAI_EXTRAS)


class TokenizeRequest(BaseModel):
    """`POST /tokenize` (vLLM's shape): text, or chat messages through the chat template."""

    model_config = _Strict
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[Message] | None = None

    def prompt_and_field(self) -> tuple[str | list[dict[str, str]], str]:
        """The prompt to encode and the field it came from."""
        if (self.prompt is None) == (self.messages is None):
            raise PromptError("give exactly one of 'prompt', 'messages'")
        if self.prompt is not None:
            return self.prompt, "prompt"
        return [m.text() for m in self.messages], "messages"


class DetokenizeRequest(BaseModel):
    """`POST /detokenize` (vLLM's shape): token ids to text."""

    model_config = _Strict
    model: StrictStr | None = None
    tokens: list[StrictInt]


def _options(body: BaseModel, names: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Decoding options set in the body (renamed per `names`), None fields left out, and the
    body field each came from."""
    out, fields = {}, {}
    for field, value in body:
        key = names.get(field, field)
        if key in _DECODING and value is not None:
            out[key], fields[key] = value, field
    return out, fields


def prompt_field(body: BaseModel) -> str:
    """The body field holding the prompt (what an error about the prompt names)."""
    if isinstance(body, ChatRequest):
        return "messages"
    return next((k for k in ("prompt", "messages", "input_ids")
                 if getattr(body, k, None) is not None), "prompt")


# Each call turns a body into (prompt, chat, options, fields): `fields` maps each option the
# body set to the field it was sent as (max_new_tokens <- max_tokens on the OpenAI endpoints).
Call = tuple[Any, bool, dict[str, Any], dict[str, str]]


def generate_call(body) -> Call:
    """A /generate body. Exactly one of prompt/messages/input_ids."""
    given = [k for k in ("prompt", "messages", "input_ids") if getattr(body, k) is not None]
    if len(given) != 1:
        raise PromptError("give exactly one of 'prompt', 'messages', 'input_ids'"
                          + (f" (got {given})" if given else ""))
    prompt = getattr(body, given[0])
    if given[0] == "messages":
        prompt = [m.text() for m in prompt]
    return prompt, body.chat, *_options(body, {})


def chat_call(body) -> Call:
    opts, fields = _options(body, {"max_tokens": "max_new_tokens"})
    if body.max_completion_tokens is not None:
        opts["max_new_tokens"] = body.max_completion_tokens
        fields["max_new_tokens"] = "max_completion_tokens"
    return [m.text() for m in body.messages], False, opts, fields


def completion_call(body) -> Call:
    """A /v1/completions body; its `logprobs` (an int) asks for logprobs with that many
    alternatives (top_logprobs)."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise PromptError("prompt: one prompt per request (a list of one string)")
        prompt = prompt[0]
    opts, fields = _options(body, {"max_tokens": "max_new_tokens", "logprobs": "top_logprobs"})
    if "top_logprobs" in opts:
        opts["logprobs"], fields["logprobs"] = True, "logprobs"
    return prompt, False, opts, fields
