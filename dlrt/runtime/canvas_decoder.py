"""LLaDA pure diffusion and semi-autoregressive sub-blocks (ML-GSAI/LLaDA `generate.py`).

The canvas is the prompt followed by `max_new_tokens` mask tokens. Every round re-runs the whole
canvas with full bidirectional attention (no KV cache). The generation region is split into
sub-blocks of `block_length` counted from the end of the prompt (one block covering the whole
generation is pure diffusion); rounds commit only inside the current sub-block.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlrt.decoding.options import DecoderDefaults, DecodingParams
from dlrt.runtime.decoder import BlockResult, block_result, round_spec, run_rounds
from dlrt.runtime.runner import ModelRunner


class CanvasDecoder:
    def __init__(self, runner: ModelRunner, mask_token_id: int, defaults: DecoderDefaults):
        self.runner = runner
        self.mask_token_id = mask_token_id
        self.defaults = defaults

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        return prompt_len + params.max_new_tokens

    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        run, dev = self.runner, self.runner.device
        p, total = len(prompt), len(prompt) + params.max_new_tokens
        spec = round_spec(params)
        run.reset()
        canvas = torch.full((total,), self.mask_token_id, dtype=torch.int64, device=dev)
        canvas[:p] = torch.tensor(prompt, dtype=torch.int64, device=dev)
        for lo in range(p, total, params.block_length):
            hi = min(lo + params.block_length, total)

            def logits_of(block: torch.Tensor, lo: int = lo, hi: int = hi) -> torch.Tensor:
                canvas[lo:hi] = block
                return run.forward(canvas, 0, chunk_block=None, logits_from=lo)[: hi - lo]

            masked = torch.ones(hi - lo, dtype=torch.bool, device=dev)
            positions = torch.arange(lo, hi, device=dev)
            tokens, commit_round, rounds = run_rounds(
                spec, logits_of, canvas[lo:hi].clone(), masked, positions, hi - lo)
            canvas[lo:hi] = tokens
            yield block_result(tokens, commit_round, rounds, torch.ones_like(masked))
