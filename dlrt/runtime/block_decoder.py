"""SDAR block diffusion with a KV cache (JetAstra/SDAR `generate.py`, DESIGN §3).

Prefill the whole blocks of the prompt once (block-causal), put the `P mod B` remaining prompt
tokens at the front of block 0 as fixed tokens, denoise each block against the cached prefix,
and when it is decided, forward it once more to write its final K/V (the reference's extra
forward) before the next block.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlrt.decoding.options import DecoderDefaults, DecodingParams
from dlrt.runtime.decoder import BlockResult, block_result, round_spec, run_rounds
from dlrt.runtime.runner import ModelRunner


class BlockDecoder:
    def __init__(self, runner: ModelRunner, mask_token_id: int, defaults: DecoderDefaults):
        self.runner = runner
        self.mask_token_id = mask_token_id
        self.defaults = defaults

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        b = params.block_length
        return -(-(prompt_len + params.max_new_tokens) // b) * b

    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        run, dev = self.runner, self.runner.device
        b = params.block_length
        spec = round_spec(params)
        run.reset()
        prompt_t = torch.tensor(prompt, dtype=torch.int64, device=dev)
        start = (len(prompt) // b) * b
        if start:
            run.forward(prompt_t[:start], 0, chunk_block=b, write_len=start, logits_from=start)
        fixed = prompt_t[start:]
        generated = 0
        while True:
            tokens = torch.full((b,), self.mask_token_id, dtype=torch.int64, device=dev)
            tokens[: fixed.shape[0]] = fixed
            masked = torch.arange(b, device=dev) >= fixed.shape[0]
            positions = torch.arange(start, start + b, device=dev)
            free = masked.clone()
            tokens, commit_round, rounds = run_rounds(
                spec, lambda t, s=start: run.forward(t, s, chunk_block=b), tokens, masked,
                positions, b)
            result = block_result(tokens, commit_round, rounds, free)
            generated += len(result.token_ids)
            yield result
            if generated >= params.max_new_tokens:
                return
            # The consumer asked for another block: write this one's final K/V first.
            run.forward(tokens, start, chunk_block=b, write_len=b, logits_from=b)
            start += b
            fixed = fixed[:0]
