"""The canvas's device program: one sub-block window of a LLaDA canvas, every round re-running
the whole canvas (`dlrt.runtime.canvas_decoder` says how a request uses it)."""

from __future__ import annotations

import torch

from dlrt.attention.base import AttentionSpan
from dlrt.decoding.round import RoundKind
from dlrt.errors import OptionError
from dlrt.runtime.decoder import ProgramBase
from dlrt.runtime.runner import ModelRunner

PAD_TO = 64


class CanvasProgram(ProgramBase):
    """Sub-block window [lo, lo + B) of a canvas of `size` slots; lens = (0, canvas length).

    With `smooth` (dInfer's iteration smoothing, `set_smoothing` before a request) every round
    runs the LM head on the whole canvas, commits with the bar max(1 - decay * i, threshold)
    and leaves, for the next forward, w * softmax(logits) @ E (w = min(init + growth * i,
    cont_weight), i the request's rounds before it) in `soft` [size, H] at the canvas's
    positions still masked after its commit (0 elsewhere); the model adds `soft` to the
    token embeddings.
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
        self.smooth = smooth
        if smooth and runner.vocab is not None:
            raise OptionError("smoothing=True is not built with tensor parallelism (a rank "
                              "holds a shard of the logits); leave it unset")
        if smooth:
            embed = runner.model.model.transformer.wte.weight
            self.soft = torch.zeros(size, embed.shape[1], dtype=embed.dtype, device=dev)
            self.rounds_run = torch.zeros((), dtype=torch.int64, device=dev)
            # fp64: threshold, decay, init, growth, cont_weight (Python floats exactly)
            self.values = torch.zeros(5, dtype=torch.float64, device=dev)

    def set_smoothing(self, threshold: float, smoothing) -> None:
        """A request's start: its bar and `smoothing` values
        (`dlrt.decoding.options.Smoothing`), no round run, nothing to add."""
        s = smoothing
        self.values.copy_(torch.tensor([threshold, s.threshold_decay, s.cont_weight_init,
                                        s.cont_weight_growth, s.cont_weight],
                                       dtype=torch.float64))
        self.rounds_run.zero_()
        self.soft.zero_()

    def rows(self) -> torch.Tensor:
        return self.lo + self.window

    def begin(self) -> None:
        s = self.state
        s.masked.copy_(self.canvas_masked.index_select(0, self.rows()))
        s.start_block()
        s.update_flag()

    def round(self) -> None:
        rows = self.rows()
        if self.smooth:
            self._smooth_round(rows)
            return
        logits = self.runner.forward(self.canvas, self.state.lens, None, rows=rows)
        self.commit(logits, rows, rows, canvas=(self.canvas, self.canvas_masked))

    def _smooth_round(self, rows: torch.Tensor) -> None:
        threshold, decay, init, growth, top = self.values.unbind()
        i = self.rounds_run.double()
        self.state.threshold.copy_(torch.maximum(1.0 - i * decay, threshold))
        weight = torch.minimum(init + growth * i, top).to(self.soft.dtype)
        logits = self.runner.forward(self.canvas, self.state.lens, None, rows=slice(None),
                                     embeds_add=self.soft)
        self.commit(logits.index_select(0, rows), rows, rows,
                    canvas=(self.canvas, self.canvas_masked))
        embed = self.runner.model.model.transformer.wte.weight
        soft = self.runner.ops.soft_embedding(logits, embed)
        self.soft.copy_(torch.where(self.canvas_masked[:, None], weight * soft, 0.0))
        self.rounds_run.add_(1)

    def buffers(self) -> list[torch.Tensor]:
        extra = [self.soft, self.rounds_run, self.values] if self.smooth else []
        return [*self.state.tensors(), self.canvas, self.canvas_masked, self.lo, *extra]

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        return [AttentionSpan(self.size, None, start, kv_len)]

    def end(self) -> None:
        self.state.tokens.copy_(self.canvas.index_select(0, self.rows()))
        self.lo.add_(self.b)
