"""Fast-dLLM's approximate KV caches for the LLaDA canvas (NVlabs/Fast-dLLM `llada/generate.py`,
`generate_with_prefix_cache` and `generate_with_dual_cache`).

A sub-block's begin phase "refresh" forwards the whole canvas (every position's K/V enter the
cache) and commits round 0 from it. Its later rounds forward a window starting at the
sub-block against the cache: "prefix" the sub-block and everything after it (keys before the
sub-block come from the refresh), "dual" the sub-block alone (keys before and after it come
from the refresh; its own K/V are replaced each round, Fast-dLLM's `replace_position`). Every
forward writes its chunk's K/V at the chunk's positions and attends to keys below the canvas
length, so the window's fresh K/V replace the cached ones where they overlap.

"dual" with a vicinity (dInfer's `VicinityCacheIteration`, prefix_look / after_look) widens the
window by `before` positions before the sub-block and `after` after it: their K/V are
recomputed each round too, the logits and commits stay the sub-block's rows. `before` is
clipped to the prompt length by the decoder (the window never starts before position 0);
positions past the canvas length land in the buffer's tail and no query attends to them.

`state.lens` is (window start = sub-block start - before, canvas length): the window's
forward; the refresh forward reads (0, canvas length). The window has a fixed length (one
captured round serves every sub-block): before + the sub-block length + after for "dual",
the generation's whole sub-blocks for "prefix".
"""

from __future__ import annotations

import torch

from dlrt.attention.base import AttentionSpan
from dlrt.decoding.round import RoundKind
from dlrt.runtime.canvas_program import CanvasProgram
from dlrt.runtime.runner import ModelRunner


class CachedCanvasProgram(CanvasProgram):
    """A canvas of `size` slots whose first `span` are the canvas proper (the refresh forward;
    slots past it exist so a window never leaves the buffer) and windows of `window` slots
    from `before` slots ahead of the sub-block's start (the sub-block is the window's rows
    before..before + B); `cache` names the key ("prefix" or "dual").

    With `smooth` (dInfer's `IterationSmooth` / `IterSmoothWithVicinityCache` over the cache)
    the refresh adds the soft embeddings of every canvas position and leaves new ones for all
    of them (its LM head runs on the whole canvas); a round adds those of its window's
    positions and leaves new ones for the window's rows from the sub-block on (its LM head
    runs on them; the rows before the sub-block are decided and keep 0); positions outside
    the window keep theirs from the refresh.
    """

    def __init__(self, runner: ModelRunner, kind: RoundKind, b: int, size: int, span: int,
                 window: int, cache: str, mask_token_id: int, before: int = 0,
                 smooth: bool = False):
        super().__init__(runner, kind, b, size, mask_token_id, smooth)
        self.key = (f"canvas_{cache}", b, size, span, window, before, kind, smooth)
        self.span, self.window_len, self.before = span, window, before
        dev = runner.device
        self.full_lens = torch.zeros(2, dtype=torch.int32, device=dev)
        self.keep_kv_len = torch.tensor([0, 1], dtype=torch.int32, device=dev)
        self.phases = {"refresh": self.refresh}

    def refresh(self) -> None:
        """Round 0: the whole canvas at (0, canvas length); its K/V fill the cache."""
        self.begin()
        self.full_lens.copy_(self.state.lens * self.keep_kv_len)
        rows, ids, sm = self.rows(), self.canvas[: self.span], self.smoothing
        if sm is None:
            logits = self.runner.forward(ids, self.full_lens, None, rows=rows)
            self.commit(logits, rows, rows, canvas=(self.canvas, self.canvas_masked))
            return
        sm.begin(self.state.threshold)
        logits = self.runner.forward(ids, self.full_lens, None, rows=slice(None),
                                     embeds_add=sm.soft[: self.span])  # [span, V]
        self.commit(logits.index_select(0, rows), rows, rows,
                    canvas=(self.canvas, self.canvas_masked))
        sm.feed(logits, self.canvas_masked[: self.span], slice(0, self.span))

    def round(self) -> None:
        """The window [lo - before, lo - before + window) against the cache; the sub-block is
        its rows before..before + B."""
        s, sm, b, before = self.state, self.smoothing, self.b, self.before
        slots = self.lo - before + self.runner.arange(self.window_len)
        ids = self.canvas.index_select(0, slots)
        rows = self.rows()
        if sm is None:
            logits = self.runner.forward(ids, s.lens, None, rows=slice(before, before + b))
            self.commit(logits, rows, rows, canvas=(self.canvas, self.canvas_masked))
            return
        sm.begin(s.threshold)
        logits = self.runner.forward(ids, s.lens, None, rows=slice(before, None),
                                     embeds_add=sm.soft.index_select(0, slots))  # [W - before, V]
        self.commit(logits[:b], rows, rows, canvas=(self.canvas, self.canvas_masked))
        seen = slots[before:]
        sm.feed(logits, self.canvas_masked.index_select(0, seen), seen)

    def buffers(self) -> list[torch.Tensor]:
        return [*super().buffers(), self.full_lens]

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        rounds = AttentionSpan(self.window_len, None, start, kv_len)
        if phase == "refresh":
            return [AttentionSpan(self.span, None, 0, kv_len), rounds]
        return [rounds]

    def end(self) -> None:
        super().end()
        self.state.lens[0].add_(self.b)


def cached_sizes(cache: str, b: int, canvas: int, blocks: int, before: int = 0,
                 after: int = 0) -> tuple[int, int]:
    """(buffer slots, window length) of a `cache` canvas of `canvas` slots (the exact canvas
    size, padding included) and `blocks` sub-blocks of `b`; "dual" windows also hold
    `before` / `after` positions around the sub-block (the last sub-block's reach past the
    canvas).

    NOTE: a "prefix" window is as long as the first sub-block's (every sub-block of the
    generation), so later sub-blocks forward slots past the canvas length: their K/V land past
    it and no query attends to them."""
    if cache == "dual":
        return canvas + after, before + b + after
    return canvas + (blocks - 1) * b, blocks * b
