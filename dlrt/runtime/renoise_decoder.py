"""Renoising (uniform-state) decoding, DiffusionGemma's: transformers'
`DiffusionGemmaGenerationMixin.generate()` as a program of the executor.

Per canvas of L = `canvas_length` positions: an encoder pass (causal, `chunk_block` 1) writes
the K/V of the tokens not yet in the cache (the prompt, a chunk at a time, before the first
canvas; the previous canvas's committed tokens, folded into the next canvas's begin phase);
the canvas is drawn uniformly (`CanvasState.start_canvas`); then up to `max_denoising_steps`
rounds of a decoder pass (the canvas over the cached prefix, full attention; the previous
round's divided logits as self-conditioning, none on the first round) and
`denoise_canvas_round`. The last round's argmax canvas is committed. Canvases follow, one per
block of `run_blocks`, until a stop id (`LLM` trims at it) or ceil(max_new_tokens / L)
canvases, as the reference generates them.

Program per canvas: phase "first" (canvas 0) | "next" (the encoder pass of the previous
canvas, then the new one) runs the canvas draw and round 0 -> rounds while `flag` -> end
(the committed canvas kept for the next encoder pass; lens move on by L). The WHILE condition
is the canvas state's `flag`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlrt.attention.base import AttentionSpan
from dlrt.decoding.options import DecodingParams
from dlrt.decoding.renoise_round import CanvasState, denoise_canvas_round
from dlrt.models.family import Family
from dlrt.models.registry import family
from dlrt.runtime.block_state import Readback, Readbacks
from dlrt.runtime.decoder import BlockResult, DecoderBase, block_result, run_blocks
from dlrt.runtime.runner import ModelRunner

PREFILL_CHUNK = 512  # prompt tokens per encoder pass (attention scratch grows with it)


class RenoiseState(CanvasState):
    """A `CanvasState` of L positions plus what the executor and the read-back use:
    lens [2] int32, (start, start + L) of the canvas's decoder passes (its encoder pass runs at
    lens - L), and the read-back of (argmax canvas, the round that decided each position: the
    last one, logprobs when recorded, rounds run, fault)."""

    def __init__(self, n: int, vocab: int, device: torch.device,
                 self_cond_dtype: torch.dtype = torch.float32, logprobs: bool = False):
        super().__init__(n, vocab, device, self_cond_dtype, logprobs)
        self.lens = torch.zeros(2, dtype=torch.int32, device=device)
        self._readbacks = Readbacks(device, n, logprobs)

    def tensors(self) -> list[torch.Tensor]:
        return [*super().tensors(), self.lens]

    def set_lens(self, start: int, kv_len: int) -> None:
        self.lens.copy_(torch.tensor([start, kv_len], dtype=torch.int32))

    def readback_async(self) -> Readback:
        """Enqueue the canvas's read-back (stream ordered; see `Readbacks`)."""
        last = (self.round - 1).reshape(1).expand(self.n)
        return self._readbacks.start(self.argmax, last, self.logprobs, self.round, self.fault)


class RenoiseProgram:
    """One canvas of L positions at `state.lens = (start, start + L)` (recording the committed
    tokens' logprobs when built with `logprobs`)."""

    def __init__(self, runner: ModelRunner, n: int, self_cond_dtype: torch.dtype,
                 logprobs: bool = False):
        self.runner, self.n = runner, n
        dev = runner.device
        self.state = RenoiseState(n, runner.model.config.vocab_size, dev, self_cond_dtype,
                                  logprobs)
        self.key = ("renoise", n) + (("logprobs",) if logprobs else ())
        self.prev = torch.zeros(n, dtype=torch.int64, device=dev)  # the committed canvas
        self.shift = torch.tensor([-n, -n], dtype=torch.int32, device=dev)
        self.phases = {"first": self.begin, "next": self.begin_next}

    def buffers(self) -> list[torch.Tensor]:
        return [*self.state.tensors(), self.prev]

    def _positions(self) -> torch.Tensor:
        return self.state.lens[0].long() + self.runner.arange(self.n)  # [L]

    def _round(self, **model_inputs: torch.Tensor) -> None:
        s = self.state
        logits = self.runner.forward(s.canvas, s.lens, None, rows=slice(None),
                                     **model_inputs)  # [L, V] fp32
        denoise_canvas_round(logits, s, self._positions(), self.runner.ops.denoiser_draw)

    def begin(self) -> None:
        """The canvas's uniform draw and round 0 (no self-conditioning)."""
        self.state.start_canvas(self._positions())
        self._round()

    def begin_next(self) -> None:
        """A canvas after the first: the previous canvas's committed tokens enter the cache
        (an encoder pass at lens - L), then `begin`."""
        self.runner.forward(self.prev, self.state.lens + self.shift, 1, rows=None)
        self.begin()

    def round(self) -> None:
        self._round(self_conditioning=self.state.self_cond)

    def end(self) -> None:
        """Keep the committed (argmax) canvas for the next encoder pass; move to the next."""
        self.prev.copy_(self.state.argmax)
        self.state.lens.add_(self.n)

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        rounds = AttentionSpan(self.n, None, start, kv_len)
        if phase == "next":
            return [AttentionSpan(self.n, 1, start - self.n, start), rounds]
        return [rounds]


class RenoiseDecoder(DecoderBase):
    name = "renoise"
    attention = "encoder_decoder"
    padding = "padding: the last canvas is filled to canvas_length"

    @classmethod
    def supports(cls, family: Family) -> str | None:
        if family.attention != cls.attention:
            return (f"decoder {cls.name!r} does not fit a {family.name} model: it decodes "
                    f"renoising (uniform-state) families, whose causal encoder passes write the "
                    f"cache and whose canvas reads it; the model was trained with "
                    f"{family.attention} attention")
        return None

    @property
    def canvas_length(self) -> int:
        return self.runner.model.config.canvas_length

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        n = self.canvas_length
        return prompt_len + -(-params.max_new_tokens // n) * n

    def program(self, logprobs: bool = False) -> RenoiseProgram:
        n = self.canvas_length
        model = self.runner.model
        dtype = model.get_parameter(family(model.config.family).embedding).dtype
        return self.cached_program(("renoise", n, logprobs), lambda: RenoiseProgram(
            self.runner, n, dtype, logprobs))

    @torch.inference_mode()
    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        n = self.canvas_length
        prog = self.program(params.logprobs)
        state = prog.state
        ids = state.canvas.new_tensor(prompt)
        starts = range(0, len(prompt), PREFILL_CHUNK)
        for lo in starts:  # causal chunks: bounded memory
            self.runner.forward_at(ids[lo:lo + PREFILL_CHUNK], lo, chunk_block=1, rows=None)
        state.set_values(params)
        state.set_lens(len(prompt), len(prompt) + n)
        canvases = -(-params.max_new_tokens // n)

        def launch(k: int) -> None:
            self.executor.run_block(prog, "first" if k == 0 else "next")

        blocks = run_blocks(self.executor, state, launch, canvases)
        for k, readback in enumerate(blocks):
            yield block_result(readback, params.top_logprobs,
                               extra_forwards=len(starts) if k == 0 else 1)
