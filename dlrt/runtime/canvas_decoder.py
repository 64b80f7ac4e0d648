"""LLaDA pure diffusion and semi-autoregressive sub-blocks (ML-GSAI/LLaDA `generate.py`).

The canvas is the prompt followed by `max_new_tokens` mask tokens. Every round re-runs the whole
canvas with full bidirectional attention (its K/V are scratch: nothing is cached between
rounds). The generation region is split into sub-blocks of `block_length` counted from the end
of the prompt (one block covering the whole generation is pure diffusion); rounds commit only
inside the current sub-block, and the LM head runs only on its rows. The canvas buffer is padded
to a multiple of 64 so one captured graph serves nearby lengths; padding is never attended to.
With `canvas_cache` "prefix" or "dual" (Fast-dLLM's approximate caches) a sub-block re-runs
the canvas once and its later rounds reuse the cached K/V (`dlrt.runtime.canvas_cache`);
"dual" with `vicinity_before` / `vicinity_after` recomputes that many positions around the
sub-block too (dInfer's vicinity refresh). With `smoothing` masked positions also enter a
forward as the probability-weighted embedding of the last forward that saw them, carried across
sub-blocks (dInfer's iteration smoothing, `dlrt.runtime.smoothing`; over the caches its
`IterSmoothWithVicinityCache`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlrt.decoding.options import DecodingParams
from dlrt.runtime.canvas_cache import CachedCanvasProgram, cached_sizes
from dlrt.runtime.canvas_program import PAD_TO, CanvasProgram
from dlrt.runtime.decoder import (
    BlockResult,
    DecoderBase,
    block_result,
    round_kind,
    run_blocks,
)

__all__ = ["PAD_TO", "CanvasDecoder", "CanvasProgram"]


class CanvasDecoder(DecoderBase):
    name = "canvas"
    attention = "full"
    padding = ("canvas padding: the generation fills whole blocks of block_length, the canvas "
               f"a multiple of {PAD_TO} positions")

    def _size(self, prompt_len: int, params: DecodingParams) -> int:
        b = params.block_length
        span = prompt_len + -(-params.max_new_tokens // b) * b
        return -(-span // PAD_TO) * PAD_TO

    @staticmethod
    def _before(prompt_len: int, params: DecodingParams) -> int:
        """The window's positions before the sub-block: vicinity_before, clipped to the
        prompt (the first sub-block's window then starts at position 0)."""
        return min(params.vicinity_before, prompt_len)

    def _buffer(self, prompt_len: int, params: DecodingParams) -> tuple[int, int]:
        """(canvas buffer slots, window length; 0: no cache) of a request."""
        size = self._size(prompt_len, params)
        if params.canvas_cache == "none":
            return size, 0
        blocks = -(-params.max_new_tokens // params.block_length)
        return cached_sizes(params.canvas_cache, params.block_length, size, blocks,
                            self._before(prompt_len, params), params.vicinity_after)

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        return self._buffer(prompt_len, params)[0]

    def _program(self, kind, b: int, span: int, size: int, window: int, cache: str,
                 before: int, smooth: bool = False):
        if cache == "none":
            return self.cached_program((b, size, kind, smooth), lambda: CanvasProgram(
                self.runner, kind, b, size, self.mask_token_id, smooth))
        return self.cached_program((b, size, kind, cache, span, window, before, smooth),
                                   lambda: CachedCanvasProgram(
                                       self.runner, kind, b, size, span, window, cache,
                                       self.mask_token_id, before, smooth))

    @torch.inference_mode()
    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        b, p = params.block_length, len(prompt)
        total = p + params.max_new_tokens
        span, cache = self._size(p, params), params.canvas_cache
        size, window = self._buffer(p, params)
        before = self._before(p, params) if cache == "dual" else 0
        smooth = params.smoothing is not None
        prog = self._program(round_kind(params), b, span, size, window, cache, before, smooth)
        state = prog.state
        state.set_values(params)
        if smooth:
            prog.smoothing.set_request(params.strategy.threshold, params.smoothing)
        pad = size - total
        prog.canvas.copy_(torch.tensor(prompt + [self.mask_token_id] * (total - p + pad)))
        prog.canvas_masked.copy_(torch.tensor([False] * p + [True] * (total - p) + [False] * pad))
        prog.lo.fill_(p)
        state.set_lens(0 if cache == "none" else p - before, total)
        starts = list(range(p, total, b))
        phase = "first" if cache == "none" else "refresh"

        def launch(k: int) -> None:
            length = min(b, total - starts[k])
            if k == 0 or length != b:
                state.set_request(length, params.denoising_steps, params.sampling.seed)
            self.executor.run_block(prog, phase)

        blocks = run_blocks(self.executor, state, launch, len(starts))
        for k, readback in enumerate(blocks):
            yield block_result(readback, params.top_logprobs, keep=min(b, total - starts[k]))
