"""Stops within a request's output: stop ids per block, stop strings in the streamed text."""

from __future__ import annotations

from dlrt.decoding.options import DecodingParams
from dlrt.tokenizer import TextStream


def trim(tokens: list[int], params: DecodingParams, room: int):
    """Cut a block's tokens before the first stop id and at the `max_new_tokens` room left."""
    for i, t in enumerate(tokens[:room]):
        if t in params.stop_token_ids:
            return tokens[:i], "stop", t
    if len(tokens) >= room:
        return tokens[:room], "length", None
    return tokens, None, None


def find_stop_string(text: TextStream, stops: tuple[str, ...], before: int, done: int):
    """If a stop string ends in the text added since character `before`, return (tokens to
    keep: up to the one that completes the earliest stop string, the stop string, its character
    offset). Only the tail is searched, so the cost does not grow with the output."""
    start = max(0, before - max(len(s) for s in stops) + 1)
    tail = text.window(start)
    hits = [(tail.find(s), s) for s in stops if s in tail]
    if not hits:
        return None
    pos, stop = min(hits)
    keep = max(done, 1)
    while stop not in text.decode(text.ids[:keep]):
        keep += 1
    return keep, stop, start + pos


def stop_holdback(text: TextStream, stops: tuple[str, ...]) -> int:
    """Character offset up to which the text may be emitted: before the longest tail of it
    that is a proper prefix of a stop string."""
    longest = max(len(s) for s in stops)
    tail = text.window(max(0, len(text) - longest))
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(tail)), hold, -1):
            if tail.endswith(stop[:n]):
                hold = n
                break
    return len(text) - hold
