"""SDAR block diffusion with a KV cache (JetAstra/SDAR `generate.py`, DESIGN §3).

Prefill the whole blocks of the prompt once (block-causal, a few blocks per forward), put the
`P mod B` remaining prompt tokens at the front of block 0 as fixed tokens, and denoise each
block against the cached prefix. The reference forwards a decided block once more so its
final K/V enter the cache; here that forward is folded into the next block's first round:
round 0 of block k+1 forwards [block k (decided) + block k+1 (masked)] block-causally (block k
sees the prefix and itself, exactly its separate forward; block k+1 also sees block k), with
logits for block k+1 only. One forward per block saved, same attention pattern. Program per
block: phase "first" (block 0) | "folded" (later blocks, runs round 0) -> rounds -> end.

Token editing (LLaDA2.1 `generate()`, a round kind of its own): each round may also rewrite
decided positions of the active block (never its prompt tokens, never earlier blocks), and a
block ends on a round begun with no mask that changes nothing, or when the post passes
(rounds begun with no mask) would exceed `max_post_steps` (`BlockState.update_flag`). A block
is yielded only once it has ended, so streamed blocks never change.

Iteration smoothing (dInfer's `IterationSmooth` on a block, `smoothing`; not with editing):
round i of the request (counted across blocks) commits at its decayed bar, and the block's
positions still masked after it enter round i + 1 as their mask embedding plus
w_i * softmax(logits) @ E (`dlrt.runtime.smoothing`); a block's round 0 (the folded one
included) adds nothing, no forward having seen its positions.
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
from dlrt.runtime.smoothing import SoftFeedback

PREFILL_CHUNK = 512  # prompt tokens per prefill forward (attention scratch grows with it)


class BlockProgram(ProgramBase):
    """One SDAR block of B positions at `state.lens = (start, start + B)`; with `smooth`,
    the block's soft embeddings (`smoothing`, `SoftFeedback` of B positions; its
    `set_request` before a request)."""

    def __init__(self, runner: ModelRunner, kind: RoundKind, b: int, mask_token_id: int,
                 smooth: bool = False):
        super().__init__("block", runner, kind, b, smooth, mask_token_id=mask_token_id)
        self.prev = torch.zeros(b, dtype=torch.int64, device=runner.device)  # decided block
        self.shift = torch.tensor([-b, 0], dtype=torch.int32, device=runner.device)
        self.phases = {"first": self.begin, "folded": self.begin_folded}
        self.smoothing = SoftFeedback(runner, b) if smooth else None

    def buffers(self) -> list[torch.Tensor]:
        extra = [] if self.smoothing is None else self.smoothing.buffers()
        return [*self.state.tensors(), self.prev, *extra]

    def begin(self) -> None:
        """Block 0: its tokens, mask and editable positions were loaded on the host."""
        self.state.start_block()
        self.state.update_flag(self.kind.editing)

    def begin_folded(self) -> None:
        """Round 0 of a block after the first (all masked, set here on the device):
        [previous block + this block] in one forward at (start - B, start + B); the previous
        block's K/V enter the cache."""
        s = self.state
        s.tokens.copy_(self.mask_block)
        s.masked.fill_(True)
        s.editable.fill_(True)
        s.start_block()
        if self.smoothing is not None:
            self.smoothing.begin(s.threshold)
        chunk = torch.cat([self.prev, s.tokens])  # [2B]
        logits = self.runner.forward(chunk, s.lens + self.shift, self.b,
                                     rows=slice(self.b, 2 * self.b))  # [B, V]
        self._commit(logits)

    def round(self) -> None:
        s, extra = self.state, {}
        if self.smoothing is not None:
            self.smoothing.begin(s.threshold)
            extra = dict(embeds_add=self.smoothing.soft)
        logits = self.runner.forward(s.tokens, s.lens, self.b, rows=slice(None),
                                     **extra)  # [B, V]
        self._commit(logits)

    def _commit(self, logits: torch.Tensor) -> None:
        """The round's commit from the block's logits [B, V]; with smoothing, the soft
        embeddings of the positions left masked."""
        positions = self.state.lens[0].long() + self.runner.arange(self.b)
        self.commit(logits, positions)
        if self.smoothing is not None:
            self.smoothing.feed(logits, self.state.masked, slice(None))

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        b = self.b
        rounds = AttentionSpan(b, b, start, kv_len)
        if phase == "folded":
            return [AttentionSpan(2 * b, b, start - b, kv_len), rounds]
        return [rounds]

    def end(self) -> None:
        """Keep the decided block for the next block's folded round 0; move to the next."""
        s = self.state
        self.prev.copy_(s.tokens)
        s.lens.add_(self.b)


class BlockDecoder(DecoderBase):
    name = "block"
    attention = "block_causal"
    padding = "padding: the last block is filled to block_length"

    def program(self, params: DecodingParams) -> BlockProgram:
        kind, b = round_kind(params), params.block_length
        smooth = params.smoothing is not None
        return self.cached_program((b, kind, smooth), lambda: BlockProgram(
            self.runner, kind, b, self.mask_token_id, smooth))

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        b = params.block_length
        return -(-(prompt_len + params.max_new_tokens) // b) * b

    @torch.inference_mode()
    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        b = params.block_length
        prog = self.program(params)
        state = prog.state
        start = (len(prompt) // b) * b
        ids = state.tokens.new_tensor(prompt[:start])
        step = max(b, PREFILL_CHUNK // b * b)
        for lo in range(0, start, step):  # whole blocks, a chunk at a time: bounded memory
            self.runner.forward_at(ids[lo:lo + step], lo, chunk_block=b, rows=None)
        fixed = prompt[start:]
        state.set_request(b, params.denoising_steps, params.sampling.seed)
        state.set_values(params)
        if prog.smoothing is not None:
            prog.smoothing.set_request(params.strategy.threshold, params.smoothing)
        state.set_lens(start, start + b)
        first = b - len(fixed)
        n_blocks = 1 + -(-max(0, params.max_new_tokens - first) // b)

        def launch(k: int) -> None:
            if k == 0:
                state.load_block(fixed + [self.mask_token_id] * first,
                                 [False] * len(fixed) + [True] * first)
            self.executor.run_block(prog, "first" if k == 0 else "folded")

        blocks = run_blocks(self.executor, state, launch, n_blocks)
        for k, readback in enumerate(blocks):
            yield block_result(readback, params.top_logprobs, skip=len(fixed) if k == 0 else 0,
                               extra_forwards=-(-start // step) if k == 0 else 0)
