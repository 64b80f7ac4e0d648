"""dLLM-Var block decoding with a KV cache and look-ahead (maomaocun/dLLM-Var
`generate_function.py`).

Fully bidirectional attention. The prompt is forwarded together with the first mask block; the
prompt's K/V enter the cache and the block's logits serve as its round 0. Each later block
starts with one forward of [finished block + new mask block]: the finished block's K/V (which
see the new block, as in the reference) enter the cache, and the new block gets its round 0.
Blocks are counted from the end of the prompt.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlrt.decoding.options import DecoderDefaults, DecodingParams
from dlrt.runtime.decoder import BlockResult, block_result, round_spec, run_rounds
from dlrt.runtime.runner import ModelRunner


class LookaheadDecoder:
    def __init__(self, runner: ModelRunner, mask_token_id: int, defaults: DecoderDefaults):
        self.runner = runner
        self.mask_token_id = mask_token_id
        self.defaults = defaults

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        b = params.block_length
        return prompt_len + -(-params.max_new_tokens // b) * b

    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        run, dev = self.runner, self.runner.device
        b = params.block_length
        spec = round_spec(params)
        run.reset()
        mask_block = torch.full((b,), self.mask_token_id, dtype=torch.int64, device=dev)
        done = torch.tensor(prompt, dtype=torch.int64, device=dev)  # tokens not yet cached
        start, generated = 0, 0
        while True:
            chunk = torch.cat([done, mask_block])
            head = done.shape[0]
            first = run.forward(chunk, start, chunk_block=None, write_len=head, logits_from=head)
            start += head
            masked = torch.ones(b, dtype=torch.bool, device=dev)
            positions = torch.arange(start, start + b, device=dev)
            tokens, commit_round, rounds = run_rounds(
                spec, lambda t, s=start: run.forward(t, s, chunk_block=None), mask_block.clone(),
                masked, positions, b, first_logits=first)
            result = block_result(tokens, commit_round, rounds, torch.ones_like(masked))
            generated += b
            yield result
            if generated >= params.max_new_tokens:
                return
            done = tokens
