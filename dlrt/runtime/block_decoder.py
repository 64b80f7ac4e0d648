"""SDAR block diffusion with a KV cache (JetAstra/SDAR `generate.py`, DESIGN §3).

Prefill the whole blocks of the prompt once (block-causal), put the `P mod B` remaining prompt
tokens at the front of block 0 as fixed tokens, and denoise each block against the cached
prefix. The reference forwards a decided block once more so its final K/V enter the cache;
here that forward is folded into the next block's first round: round 0 of block k+1 forwards
[block k (decided) + block k+1 (masked)] block-causally (block k sees the prefix and itself,
exactly its separate forward; block k+1 also sees block k), with logits for block k+1 only.
One forward per block saved, same attention pattern. Program per block:
begin (block 0) | begin_folded (later blocks, runs round 0) -> rounds -> end.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlrt.decoding.options import DecodingParams
from dlrt.decoding.round import RoundSpec
from dlrt.runtime.block_state import BlockState
from dlrt.runtime.decoder import (
    BlockResult,
    DecoderBase,
    ProgramBase,
    block_result,
    commit_round,
    round_spec,
)
from dlrt.runtime.runner import ModelRunner


class BlockProgram(ProgramBase):
    """One SDAR block of B positions at `state.lens = (start, start + B)`."""

    def __init__(self, runner: ModelRunner, spec: RoundSpec, b: int):
        self.runner, self.spec, self.b = runner, spec, b
        self.state = BlockState(b, runner.device)
        self.key = ("block", b, spec)
        self.prev = torch.zeros(b, dtype=torch.int64, device=runner.device)  # decided block
        self.shift = torch.tensor([-b, 0], dtype=torch.int32, device=runner.device)

    def buffers(self) -> list[torch.Tensor]:
        return [*self.state.tensors(), self.prev]

    def begin(self) -> None:
        self.state.round.zero_()
        self.state.commit_round.fill_(-1)
        self.state.update_flag()

    def begin_folded(self) -> None:
        """Round 0 of a block after the first: [previous block + this block] in one forward
        at (start - B, start + B); the previous block's K/V enter the cache."""
        s = self.state
        s.round.zero_()
        s.commit_round.fill_(-1)
        chunk = torch.cat([self.prev, s.tokens])  # [2B]
        logits = self.runner.forward(chunk, s.lens + self.shift, self.b,
                                     rows=slice(self.b, 2 * self.b))
        positions = s.lens[0].long() + self.runner.arange(self.b)
        commit_round(self.spec, s, logits, positions)

    def round(self) -> None:
        s = self.state
        logits = self.runner.forward(s.tokens, s.lens, self.b, rows=slice(None))  # [B, V]
        positions = s.lens[0].long() + self.runner.arange(self.b)
        commit_round(self.spec, s, logits, positions)

    def end(self) -> None:
        """Keep the decided block for the next block's folded round 0; move to the next."""
        s = self.state
        self.prev.copy_(s.tokens)
        s.lens.add_(self.b)


class BlockDecoder(DecoderBase):

    def program(self, params: DecodingParams) -> BlockProgram:
        spec, b = round_spec(params), params.block_length
        return self.cached_program((b, spec), lambda: BlockProgram(self.runner, spec, b))

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        b = params.block_length
        return -(-(prompt_len + params.max_new_tokens) // b) * b

    @torch.inference_mode()
    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        b = params.block_length
        prog = self.program(params)
        state = prog.state
        start = (len(prompt) // b) * b
        if start:
            ids = state.tokens.new_tensor(prompt[:start])
            self.runner.forward_at(ids, 0, chunk_block=b, rows=None)
        fixed = prompt[start:]
        state.set_request(b, params.denoising_steps, params.sampling.seed)
        state.set_lens(start, start + b)
        generated = 0
        while True:
            state.load_block(fixed + [self.mask_token_id] * (b - len(fixed)),
                             [False] * len(fixed) + [True] * (b - len(fixed)))
            first = not generated
            self.executor.run_block(prog, begin=prog.begin if first else prog.begin_folded)
            tokens, commits, rounds = state.readback()
            result = block_result(tokens, commits, rounds, skip=len(fixed),
                                  extra_forwards=1 if start and first else 0)
            generated += len(result.token_ids)
            yield result
            if generated >= params.max_new_tokens:
                return
            fixed = []
