"""The canvas's device program: one sub-block window of a LLaDA canvas, every round re-running
the whole canvas (`dlrt.runtime.canvas_decoder` says how a request uses it)."""

from __future__ import annotations

import torch

from dlrt.attention.base import AttentionSpan
from dlrt.decoding.round import RoundKind
from dlrt.runtime.decoder import ProgramBase
from dlrt.runtime.runner import ModelRunner
from dlrt.runtime.smoothing import SoftFeedback

PAD_TO = 64


class CanvasProgram(ProgramBase):
    """Sub-block window [lo, lo + B) of a canvas of `size` slots; lens = (0, canvas length).

    With `smooth` (dInfer's iteration smoothing, `smoothing.set_request` before a request)
    every round runs the LM head on the whole canvas and feeds the soft embeddings of every
    canvas position to the next round (`dlrt.runtime.smoothing.SoftFeedback`, over the
    canvas's slots).
    """

    def __init__(self, runner: ModelRunner, kind: RoundKind, b: int, size: int,
                 mask_token_id: int, smooth: bool = False):
        super().__init__("canvas", runner, kind, b, size, smooth, mask_token_id=mask_token_id)
        self.size = size
        dev = runner.device
        self.canvas = torch.zeros(size, dtype=torch.int64, device=dev)
        self.canvas_masked = torch.zeros(size, dtype=torch.bool, device=dev)
        self.lo = torch.zeros((), dtype=torch.int64, device=dev)
        self.window = runner.arange(b)
        self.phases = {"first": self.begin}
        self.smoothing = SoftFeedback(runner, size) if smooth else None

    def rows(self) -> torch.Tensor:
        return self.lo + self.window

    def begin(self) -> None:
        s = self.state
        s.masked.copy_(self.canvas_masked.index_select(0, self.rows()))
        s.start_block()
        s.update_flag()

    def round(self) -> None:
        rows = self.rows()
        if self.smoothing is None:
            logits = self.runner.forward(self.canvas, self.state.lens, None, rows=rows)
            self.commit(logits, rows, rows, canvas=(self.canvas, self.canvas_masked))
            return
        self.smoothing.begin(self.state.threshold)
        logits = self.runner.forward(self.canvas, self.state.lens, None, rows=slice(None),
                                     embeds_add=self.smoothing.soft)  # [size, V]
        self.commit(logits.index_select(0, rows), rows, rows,
                    canvas=(self.canvas, self.canvas_masked))
        self.smoothing.feed(logits, self.canvas_masked, slice(None))

    def buffers(self) -> list[torch.Tensor]:
        extra = [] if self.smoothing is None else self.smoothing.buffers()
        return [*self.state.tensors(), self.canvas, self.canvas_masked, self.lo, *extra]

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        return [AttentionSpan(self.size, None, start, kv_len)]

    def end(self) -> None:
        self.state.tokens.copy_(self.canvas.index_select(0, self.rows()))
        self.lo.add_(self.b)
