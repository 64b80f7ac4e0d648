"""The body of Anthropic's `POST /v1/messages` (as vLLM serves it), validated strictly, and its
translation to an `LLM` call: `system` (a string or a list of text blocks) becomes the first
chat message, each message's `content` (a string or a list of text blocks) its text;
`max_tokens` (required) is max_new_tokens and `stop_sequences` are stop strings; `temperature`,
`top_p` and `top_k`, and dlrt's `seed` and decoding options, as on the OpenAI endpoints. Tool use
and extended thinking are refused (400 naming the field)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    create_model,
)

from dlrt.errors import PromptError
from dlrt.server.protocol import _OPENAI_EXTRAS, Call, _options, _Strict, accept_only


def _text(content: str | list[dict[str, Any]], where: str) -> str:
    """A string, or the joined text of a list of text blocks ({"type": "text", "text"}, with
    Anthropic's `cache_control` and `citations` taken as having no effect)."""
    if isinstance(content, str):
        return content
    parts = []
    for i, block in enumerate(content):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise PromptError(f"{where}.{i}: only text blocks ({{\"type\": \"text\", \"text\": "
                              f"...}}) are supported, got type {block.get('type')!r}")
        extra = sorted(set(block) - {"type", "text", "cache_control", "citations"})
        if extra:
            raise PromptError(f"{where}.{i}: unknown field(s) of a text block: {extra}")
        parts.append(block["text"])
    return "".join(parts)


class AnthropicMessage(BaseModel):
    """One turn: `role` user or assistant; `content` a string or a list of text blocks."""

    model_config = _Strict
    role: Literal["user", "assistant"]
    content: StrictStr | list[dict[str, Any]]


class _MessagesBase(BaseModel):
    model_config = _Strict
    model: StrictStr
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: StrictInt
    system: StrictStr | list[dict[str, Any]] | None = None
    stop_sequences: list[StrictStr] | None = None
    temperature: StrictFloat | StrictInt | None = None
    top_p: StrictFloat | StrictInt | None = None
    seed: StrictInt | None = None  # dlrt's, as on the OpenAI endpoints
    stream: StrictBool = False
    metadata: dict[StrictStr, Any] | None = None
    tools: accept_only((), "tool use is not supported") = None
    tool_choice: accept_only(({"type": "none"},), 'tool use is not supported: only '
                                                  '{"type": "none"}') = None
    thinking: accept_only(({"type": "disabled"},), "extended thinking is not supported") = None


# dlrt's decoding options (top_k among them) as on the OpenAI endpoints
MessagesRequest = create_model("MessagesRequest", __base__=_MessagesBase, **_OPENAI_EXTRAS)


def messages_call(body) -> Call:
    """A /v1/messages body as an `LLM` call (`protocol.Call`)."""
    messages = [{"role": m.role, "content": _text(m.content, f"messages.{i}.content")}
                for i, m in enumerate(body.messages)]
    if body.system is not None:
        system = _text(body.system, "system")
        if system:
            messages.insert(0, {"role": "system", "content": system})
    opts, fields = _options(body, {"max_tokens": "max_new_tokens", "stop_sequences": "stop"})
    return messages, False, opts, fields
