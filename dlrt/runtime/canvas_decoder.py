"""LLaDA pure diffusion and semi-autoregressive sub-blocks (ML-GSAI/LLaDA `generate.py`).

The canvas is the prompt followed by `max_new_tokens` mask tokens. Every round re-runs the whole
canvas with full bidirectional attention (its K/V are scratch: nothing is cached between
rounds). The generation region is split into sub-blocks of `block_length` counted from the end
of the prompt (one block covering the whole generation is pure diffusion); rounds commit only
inside the current sub-block, and the LM head runs only on its rows. The canvas buffer is padded
to a multiple of 64 so one captured graph serves nearby lengths; padding is never attended to.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlrt.attention.base import AttentionSpan
from dlrt.decoding.options import DecodingParams
from dlrt.decoding.round import RoundKind
from dlrt.runtime.decoder import (
    BlockResult,
    DecoderBase,
    ProgramBase,
    block_result,
    round_kind,
    run_blocks,
)
from dlrt.runtime.runner import ModelRunner

PAD_TO = 64


class CanvasProgram(ProgramBase):
    """Sub-block window [lo, lo + B) of a canvas of `size` slots; lens = (0, canvas length)."""

    def __init__(self, runner: ModelRunner, kind: RoundKind, b: int, size: int,
                 mask_token_id: int):
        super().__init__("canvas", runner, kind, b, size, mask_token_id=mask_token_id)
        self.size = size
        dev = runner.device
        self.canvas = torch.zeros(size, dtype=torch.int64, device=dev)
        self.canvas_masked = torch.zeros(size, dtype=torch.bool, device=dev)
        self.lo = torch.zeros((), dtype=torch.int64, device=dev)
        self.window = runner.arange(b)
        self.phases = {"first": self.begin}

    def rows(self) -> torch.Tensor:
        return self.lo + self.window

    def begin(self) -> None:
        s = self.state
        s.masked.copy_(self.canvas_masked.index_select(0, self.rows()))
        s.start_block()
        s.update_flag()

    def round(self) -> None:
        rows = self.rows()
        logits = self.runner.forward(self.canvas, self.state.lens, None, rows=rows)
        self.commit(logits, rows, rows, canvas=(self.canvas, self.canvas_masked))

    def buffers(self) -> list[torch.Tensor]:
        return [*self.state.tensors(), self.canvas, self.canvas_masked, self.lo]

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        return [AttentionSpan(self.size, None, start, kv_len)]

    def end(self) -> None:
        self.state.tokens.copy_(self.canvas.index_select(0, self.rows()))
        self.lo.add_(self.b)


class CanvasDecoder(DecoderBase):
    name = "canvas"
    attention = "full"
    padding = ("canvas padding: the generation fills whole blocks of block_length, the canvas "
               f"a multiple of {PAD_TO} positions")

    def _size(self, prompt_len: int, params: DecodingParams) -> int:
        b = params.block_length
        span = prompt_len + -(-params.max_new_tokens // b) * b
        return -(-span // PAD_TO) * PAD_TO

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        return self._size(prompt_len, params)

    @torch.inference_mode()
    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        b, p = params.block_length, len(prompt)
        total = p + params.max_new_tokens
        size = self._size(p, params)
        kind = round_kind(params)
        prog = self.cached_program((b, size, kind),
                                   lambda: CanvasProgram(self.runner, kind, b, size,
                                                         self.mask_token_id))
        state = prog.state
        state.set_values(params)
        pad = size - total
        prog.canvas.copy_(torch.tensor(prompt + [self.mask_token_id] * (total - p + pad)))
        prog.canvas_masked.copy_(torch.tensor([False] * p + [True] * (total - p) + [False] * pad))
        prog.lo.fill_(p)
        state.set_lens(0, total)
        starts = list(range(p, total, b))

        def launch(k: int) -> None:
            length = min(b, total - starts[k])
            if k == 0 or length != b:
                state.set_request(length, params.denoising_steps, params.sampling.seed)
            self.executor.run_block(prog, "first")

        blocks = run_blocks(self.executor, state, launch, len(starts))
        for k, (tokens, commits, rounds) in enumerate(blocks):
            yield block_result(tokens, commits, rounds, keep=min(b, total - starts[k]))
