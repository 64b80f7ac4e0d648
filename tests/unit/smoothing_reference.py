"""dInfer's iteration smoothing written out as plain loops, for the parity tests of the canvas
decoder's caches (`test_canvas_smoothing`) and of the block decoder (`test_block_smoothing`).

Transcribed from inclusionAI/dInfer `python/dinfer/decoding/generate_uniform.py`:
`IterationSmooth.forward` with its prefix / dual KV cache and `IterSmoothWithVicinityCache.
forward` (no warm-up), driven by `BlockRunner.decode` (batch of one), and the `H2Embed` of its
model files (tau 1): a masked position's input is its embedding plus w * softmax(logits) @ E.
The same loop applied to block decoding (`smooth_blocks`) is `IterationSmooth` without a cache
over a block-causal model: each forward runs the sequence up to the active block's end, the
decided blocks as plain embeddings.

What every loop shares:
- forward i of a request (every forward that commits, a cache refresh included; i counts
  across blocks) commits at the bar max(1 - i * threshold_decay, threshold) and, after its
  commit, gives the positions it saw H2Embed(x, x == mask, its logits, w_i),
  w_i = min(cont_weight_init + cont_weight_growth * i, cont_weight);
- a commit is dlrt's round (`dlrt.decoding.round.denoise_round`, greedy, host values; the
  strategies equal dInfer's decoders in `test_dinfer_strategies`) on the block's rows at that
  bar, the block's credit zeroed when it starts;
- forwards past a block's last mask are not run: dInfer's unrolled forwards (which advance
  its count) and the window forward its cached iteration runs right after a refresh that left
  the block without masks (dlrt runs no round on a block without masks);
- no stop at EOS (the requests set ignore_eos).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.decoding.round import RoundSpec, denoise_round
from dlrt.decoding.sampling import SamplingSpec
from dlrt.decoding.strategies import StrategySpec

GREEDY = SamplingSpec(0.0, 0, 1.0, 0)


@dataclass(frozen=True)
class Smooth:
    """A request's smoothing values and the strategy it commits with (dInfer's defaults)."""

    threshold: float
    strategy: str = "threshold"
    cont_weight: float = 0.3
    cont_weight_init: float = 0.15
    cont_weight_growth: float = 0.02
    threshold_decay: float = 0.02

    def options(self) -> dict:
        """The request options of these values."""
        return dict(smoothing=True, remasking_strategy=self.strategy, threshold=self.threshold,
                    cont_weight=self.cont_weight, cont_weight_init=self.cont_weight_init,
                    cont_weight_growth=self.cont_weight_growth,
                    threshold_decay=self.threshold_decay)

    def at(self, i: int) -> tuple[float, float]:
        """(w, bar) of forward i."""
        weight = min(self.cont_weight_init + self.cont_weight_growth * i, self.cont_weight)
        return weight, max(1 - i * self.threshold_decay, self.threshold)


def h2e(embed: torch.Tensor, x: torch.Tensor, mask_index=None, logits=None, weight=0.0):
    """dInfer's `H2Embed.__call__` (tau 1, no sequence parallelism), batch of one."""
    result = embed[x]
    if mask_index is not None and logits is not None:
        soft = torch.softmax(logits, dim=-1) @ embed
        result = torch.where(mask_index[:, None], weight * soft + 1 * result, result)
    return result


class BlockCommit:
    """dlrt's rounds on one block of `n` positions (`steps` the round budget), host values."""

    def __init__(self, smooth: Smooth, n: int, vocab: int, mask_id: int, steps: int):
        self.smooth, self.mask_id, self.steps, self.round = smooth, mask_id, steps, 0
        self.credit = torch.zeros(n, vocab) if smooth.strategy == "credit" else None

    def __call__(self, block: torch.Tensor, logits: torch.Tensor, bar: float) -> None:
        """Commit into `block` [n] int64 (a view, updated in place) from logits [n, V]."""
        spec = RoundSpec(StrategySpec(self.smooth.strategy, bar, 0.35), GREEDY, self.steps,
                         mask_token_id=self.mask_id)
        positions = torch.arange(block.shape[0])
        tokens, _, _ = denoise_round(spec, logits, block.clone(), block == self.mask_id,
                                     positions, self.round, 1, credit=self.credit)
        block.copy_(tokens)
        self.round += 1


@torch.no_grad()
def dinfer_cached(model, embed: torch.Tensor, prompt: list[int], gen_length: int,
                  block_length: int, cache: str, before: int, after: int, smooth: Smooth,
                  mask_id: int) -> list[int]:
    """`IterSmoothDiffusionLLM` / `IterSmoothWithVicinityCacheDiffusionLLM.generate` with a
    KV cache refreshed on entering a block: the generated ids. `model` has Fast-dLLM's
    interface with `inputs_embeds` (`test_canvas_cache.FastForward`); a round's window is
    [block start, canvas end) for "prefix" (dInfer's prefix `replace_position`), else
    [block start - before, block end + after) clipped to the canvas."""
    x = torch.full((len(prompt) + gen_length,), mask_id, dtype=torch.long)
    x[: len(prompt)] = torch.tensor(prompt)
    total, vocab = x.shape[0], embed.shape[0]
    inputs_embeds = h2e(embed, x)
    i = 0
    for start in range(len(prompt), total, block_length):
        end = start + block_length
        commit = BlockCommit(smooth, block_length, vocab, mask_id, block_length)
        weight, bar = smooth.at(i)  # the refresh
        logits, past = model(None, inputs_embeds=inputs_embeds[None])
        commit(x[start:end], logits[0, start:end], bar)
        inputs_embeds = h2e(embed, x, x == mask_id, logits[0], weight)
        i += 1
        left = start if cache == "prefix" else max(0, start - before)
        right = total if cache == "prefix" else min(total, end + after)
        replace = torch.zeros(1, total, dtype=torch.bool)
        replace[:, left:right] = True
        while (x[start:end] == mask_id).any():
            weight, bar = smooth.at(i)
            logits, _ = model(None, past_key_values=past, replace_position=replace,
                              inputs_embeds=inputs_embeds[None, left:right])
            offset = start - left
            commit(x[start:end], logits[0, offset:offset + block_length], bar)
            window = x[left:right]
            inputs_embeds[left:right] = h2e(embed, window, window == mask_id, logits[0],
                                             weight)
            i += 1
    return x[len(prompt):].tolist()


@torch.no_grad()
def smooth_blocks(forward, embed: torch.Tensor, prompt: list[int], gen_length: int,
                  block_length: int, smooth: Smooth, mask_id: int) -> list[int]:
    """`IterationSmooth` over block decoding (SDAR's alignment: blocks at multiples of B, the
    prompt's tail fixed at the front of its block): the first `gen_length` generated ids.
    `forward(embeds [L, H], positions [L])` -> logits [L, V], block-causal with blocks of B,
    nothing cached. A block's first forward adds nothing (no forward saw its positions)."""
    p, b = len(prompt), block_length
    n_blocks = -(-(p + gen_length) // b)
    x = torch.full((n_blocks * b,), mask_id, dtype=torch.long)
    x[:p] = torch.tensor(prompt)
    i = 0
    for lo in range(p // b * b, n_blocks * b, b):
        hi = lo + b
        commit = BlockCommit(smooth, b, embed.shape[0], mask_id, b)
        block_embeds = h2e(embed, x[lo:hi])  # dInfer's reset: plain embeddings
        while (x[lo:hi] == mask_id).any():
            weight, bar = smooth.at(i)
            embeds = torch.cat([embed[x[:lo]], block_embeds])
            logits = forward(embeds, torch.arange(hi))[lo:hi]
            commit(x[lo:hi], logits, bar)
            block = x[lo:hi]
            block_embeds = h2e(embed, block, block == mask_id, logits, weight)
            i += 1
    return x[p:p + gen_length].tolist()
