"""dLLM-Var block decoding with a KV cache and look-ahead (maomaocun/dLLM-Var
`generate_function.py`).

Fully bidirectional attention. The prompt is forwarded together with the first mask block; the
prompt's K/V enter the cache and the block's logits serve as its round 0. Each later block
starts with one forward of [finished block + new mask block]: the finished block's K/V (which
see the new block, as in the reference) enter the cache, and the new block gets its round 0.
Blocks are counted from the end of the prompt. Program: phase "next" (look-ahead forward +
round 0) -> rounds; block 0 begins on the host (the prefill forward has a prompt-dependent
length) and its graph has phase "first" (the flag only).
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


class LookaheadProgram(ProgramBase):
    """The current block at `state.lens = (start, start + B)`; begin moves to the next."""

    def __init__(self, runner: ModelRunner, kind: RoundKind, b: int, mask_token_id: int):
        super().__init__("dllm_var", runner, kind, b, mask_token_id=mask_token_id)
        self.step = torch.tensor([0, b], dtype=torch.int32, device=runner.device)
        self.positions = runner.arange(b)
        self.phases = {"first": self.flag_only, "next": self.begin}

    def _reset_block(self) -> None:
        s = self.state
        s.tokens.copy_(self.mask_block)
        s.masked.fill_(True)
        s.start_block()

    def begin(self) -> None:
        """[finished block + new mask block] at the finished block's start: its K/V enter the
        cache, the new block gets round 0."""
        s = self.state
        chunk = torch.cat([s.tokens, self.mask_block])  # [2B]
        logits = self.runner.forward(chunk, s.lens + self.step, None,
                                     rows=slice(self.b, 2 * self.b))
        s.lens.add_(self.b)
        self._reset_block()
        self.commit(logits, s.lens[0].long() + self.positions)

    def begin_first(self, prompt: list[int]) -> None:
        """Block 0 (host): forward [prompt + mask block]; the prompt's K/V enter the cache."""
        s, p = self.state, len(prompt)
        chunk = torch.cat([s.tokens.new_tensor(prompt), self.mask_block])
        logits = self.runner.forward_at(chunk, 0, None, rows=slice(p, p + self.b))
        s.set_lens(p, p + self.b)
        self._reset_block()
        self.commit(logits, s.lens[0].long() + self.positions)

    def flag_only(self) -> None:
        self.state.update_flag()

    def round(self) -> None:
        s = self.state
        logits = self.runner.forward(s.tokens, s.lens, None, rows=slice(None))
        self.commit(logits, s.lens[0].long() + self.positions)

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        b = self.b
        if phase == "next":  # the look-ahead forward, then rounds one block further
            return [AttentionSpan(2 * b, None, start, kv_len + b),
                    AttentionSpan(b, None, start + b, kv_len + b)]
        return [AttentionSpan(b, None, start, kv_len)]

    def end(self) -> None:
        """Nothing: the next block's look-ahead writes this block's K/V."""


class LookaheadDecoder(DecoderBase):
    name = "dllm_var"
    attention = "full"
    padding = "padding: the generation fills whole blocks of block_length"

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        b = params.block_length
        return prompt_len + -(-params.max_new_tokens // b) * b

    @torch.inference_mode()
    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        b = params.block_length
        kind = round_kind(params)
        prog = self.cached_program((b, kind), lambda: LookaheadProgram(
            self.runner, kind, b, self.mask_token_id))
        prog.state.set_request(b, params.denoising_steps, params.sampling.seed)
        prog.state.set_values(params)
        prog.begin_first(prompt)

        def launch(k: int) -> None:
            self.executor.run_block(prog, "first" if k == 0 else "next")

        n_blocks = -(-params.max_new_tokens // b)
        blocks = run_blocks(self.executor, prog.state, launch, n_blocks)
        for readback in blocks:
            yield block_result(readback, params.top_logprobs, extra_forwards=0)
