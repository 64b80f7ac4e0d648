"""Generated tokens' logprobs (`dlrt.outputs.TokenLogprob`) in the shapes the endpoints answer:
`/generate`'s rows, OpenAI chat's `logprobs.content` and the legacy completions' `logprobs`
object. A token's string is the tokenizer's decoding of it alone; its `bytes` are its exact
bytes under a byte-level BPE tokenizer (a token may hold part of a UTF-8 character), else the
UTF-8 bytes of its string."""

from __future__ import annotations

from functools import cache
from typing import Any

from dlrt.outputs import TokenLogprob


def generate_rows(items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """/generate: [{"token_id", "logprob", "top_logprobs": [{"token_id", "logprob"}]}]."""
    return [{"token_id": x.token_id, "logprob": x.logprob,
             "top_logprobs": [{"token_id": t.token_id, "logprob": t.logprob}
                              for t in x.top_logprobs]} for x in items]


class TokenText:
    """Token strings and bytes of a tokenizer (cached per id)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._bytes_of = _byte_decoder(tokenizer)
        self.text = cache(self._text)
        self.bytes = cache(self._bytes)

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _bytes(self, token_id: int) -> tuple[int, ...]:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        table = self._bytes_of
        if table is not None and isinstance(piece, str) and all(c in table for c in piece):
            return tuple(table[c] for c in piece)
        return tuple(self.text(token_id).encode("utf-8"))

    def chat(self, items: list[TokenLogprob]) -> dict[str, Any]:
        """OpenAI chat's `choices[i].logprobs`: {"content": [{token, logprob, bytes,
        top_logprobs: [{token, logprob, bytes}]}]}."""
        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            return {"token": self.text(token_id), "logprob": logprob,
                    "bytes": list(self.bytes(token_id))}

        return {"content": [{**entry(x.token_id, x.logprob), "top_logprobs": [
            entry(t.token_id, t.logprob) for t in x.top_logprobs]} for x in items]}

    def completion(self, items: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        """The legacy completions' `choices[i].logprobs`: {tokens, token_logprobs,
        top_logprobs (per token {token: logprob} of its alternatives and itself, as the
        OpenAI API always adds the sampled token), text_offset (each token's character offset:
        `offset` plus the lengths of the token strings before it, vLLM's rule)}."""
        tokens = [self.text(x.token_id) for x in items]
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        top = [{**{self.text(t.token_id): t.logprob for t in x.top_logprobs},
                self.text(x.token_id): x.logprob} for x in items]
        return {"tokens": tokens, "token_logprobs": [x.logprob for x in items],
                "top_logprobs": top, "text_offset": offsets}


def _byte_decoder(tokenizer) -> dict[str, int] | None:
    """The byte-level BPE table (character -> byte) when the tokenizer decodes with it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if type(getattr(backend, "decoder", None)).__name__ != "ByteLevel":
        return None
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}
