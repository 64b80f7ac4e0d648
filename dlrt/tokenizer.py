"""Tokenizer loading (transformers' AutoTokenizer, no remote code) and prompt encoding."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from dlrt.errors import CheckpointError, PromptError

Prompt = str | list[dict[str, Any]] | list[int]
ROLES = ("system", "user", "assistant", "tool")


def load_tokenizer(path: str | Path):
    """AutoTokenizer from a local folder with `trust_remote_code=False`; None if it has none.

    Raises:
        CheckpointError: the tokenizer files are unreadable or corrupt.
    """
    root = Path(path)
    if not any((root / n).is_file()
               for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # NOTE: AutoTokenizer reads config.json and warns that it does not know `sdar`/`llada`;
    # the tokenizer class comes from tokenizer_config.json, so the warning is noise.
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # config fields it would rename
            tokenizer = AutoTokenizer.from_pretrained(str(root), trust_remote_code=False)
    except Exception as e:  # NOTE: transformers and tokenizers raise many unrelated types
        # NOTE: one line (transformers' config validation writes several)
        raise CheckpointError(f"cannot load the tokenizer of {root}: "
                              f"{' '.join(str(e).split())}") from e
    finally:
        hf_logging.set_verbosity(level)
    # NOTE: the engine checks a prompt against the model's context (max_model_len); the
    # tokenizer's own limit (model_max_length, often a training length) only made transformers
    # warn of "sequence length is longer" before that check
    tokenizer.model_max_length = int(1e30)
    return tokenizer


def is_prompt_list(prompt: Any) -> bool:
    """Whether `prompt` is a list of prompts rather than one: a non-empty list of texts, or
    of lists (chat message lists, token id lists)."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and (
        all(isinstance(p, str) for p in prompt)
        or all(isinstance(p, (list, tuple)) for p in prompt))


def encode_prompt(tokenizer, prompt: Prompt, vocab_size: int, chat: bool = False) -> list[int]:
    """Token ids of a prompt: text (through the chat template when `chat`), chat messages
    (always through the chat template), or token ids (checked against the vocabulary).

    Raises:
        PromptError: empty prompt, a bad type, text that is not valid Unicode (lone
            surrogates), malformed messages or an unknown role, ids out of the vocabulary,
            or text given to a checkpoint without a tokenizer.
    """
    if isinstance(prompt, str):
        if not prompt:
            raise PromptError("prompt is empty")
        _check_text(prompt, "prompt")
        if chat:
            return encode_prompt(tokenizer, [{"role": "user", "content": prompt}], vocab_size)
        _need_tokenizer(tokenizer)
        return _in_vocabulary(list(tokenizer.encode(prompt)), vocab_size)
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise PromptError("prompt must be a non-empty string, list of messages or list of ids")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise PromptError(f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
        return list(prompt)
    if all(isinstance(m, dict) for m in prompt):
        for i, m in enumerate(prompt):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptError(f"message {i} needs string 'role' and 'content' fields")
            if m["role"] not in ROLES:
                raise PromptError(f"message {i} has role {m['role']!r}; roles: {ROLES}")
            _check_text(m["content"], f"message {i}")
        _need_tokenizer(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise PromptError("the checkpoint's tokenizer has no chat template")
        text = tokenizer.apply_chat_template(list(prompt), tokenize=False,
                                             add_generation_prompt=True)
        return _in_vocabulary(list(tokenizer.encode(text, add_special_tokens=False)), vocab_size)
    raise PromptError("prompt list must hold only token ids or only chat messages (dicts)")


def _in_vocabulary(ids: list[int], vocab_size: int) -> list[int]:
    bad = sorted({t for t in ids if not 0 <= t < vocab_size})
    if bad:
        raise PromptError(f"the tokenizer gives id(s) {bad[:5]} outside the model's vocabulary "
                          f"[0, {vocab_size}): the checkpoint's tokenizer does not fit its "
                          "config.json")
    return ids


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PromptError(f"{what} is not valid Unicode text: {e}") from e


def _need_tokenizer(tokenizer) -> None:
    if tokenizer is None:
        raise PromptError("this checkpoint has no tokenizer: pass token ids instead of text")


class TextStream:
    """Incremental detokenisation in O(new tokens) per block (vLLM's prefix/read offsets):
    each step decodes only the last piece plus a few tokens of context. Text that ends in an
    incomplete UTF-8 character stays `pending` until it completes. `emit` hands out the text
    not yet emitted, up to an optional character `limit` (stop strings)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # decoded text of ids[:_read]
        self.pending = ""  # text of ids[_read:] while it ends in an incomplete character
        self.emitted = 0
        self._prefix = 0  # ids[_prefix:_read]: context for decoding the next piece
        self._read = 0

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def __len__(self) -> int:
        return len(self.text) + len(self.pending)

    def extend(self, ids: list[int]) -> None:
        self.ids.extend(ids)
        head = self.decode(self.ids[self._prefix:self._read])
        piece = self.decode(self.ids[self._prefix:])[len(head):]
        if piece.endswith("\ufffd"):
            self.pending = piece
            return
        self.text += piece
        self.pending = ""
        self._prefix, self._read = self._read, len(self.ids)

    def window(self, start: int) -> str:
        """The text from character `start` to the end (pending included)."""
        if start >= len(self.text):
            return self.pending[start - len(self.text):]
        return self.text[start:] + self.pending

    def emit(self, final: bool = False, limit: int | None = None) -> str:
        """Text not emitted yet, up to `limit`; pending text only when `final`."""
        end = len(self) if final else len(self.text)
        if limit is not None:
            end = min(end, limit)
        if end <= self.emitted:
            return ""
        delta = self.window(self.emitted)[: end - self.emitted]
        self.emitted = end
        return delta
