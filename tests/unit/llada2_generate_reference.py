"""LLaDA2's official `generate()` written out in plain PyTorch, for parity tests.

Transcribed from the loop of `modeling_llada2_moe.py` (inclusionAI LLaDA2.0 and LLaDA2.1):
the prompt at the front of a canvas of whole blocks aligned at multiples of B, every pass a
full-sequence forward of [prompt + decided blocks + the active block] with a block-causal
mask, nothing cached. Per pass over the active block:

- mask commits (2.0 rule, one token to transfer): every masked position with p > threshold;
  if none, the single most confident masked position (lowest index on ties);
- edits (2.1, `editing_threshold` not None): a decided position that is not a prompt token is
  rewritten when the candidate differs from its token, is not the mask token, and has
  p > editing_threshold;
- the block ends: 2.0 (no editing) when no mask is left, within B passes; 2.1:
  `post = 0; loop: unmasked = no mask; if unmasked: post += 1; if post > max_post_steps:
  stop; pass; if unmasked and no edit: stop`.
After a block, stop if it holds a stop id.

Two defects of the official files are not copied: attention is block-causal (the 2.1 file
passes a 0/1 mask that lets every block see later ones), and temperature 0 is argmax (the
official sampler draws from the softmax at any temperature). Greedy only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# (ids [L] int64, positions [L] int64) -> logits [L, V]; attention block-causal with blocks
# of B aligned at position 0 (see `block_causal_mask`)
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def block_causal_mask(positions: torch.Tensor, block_length: int) -> torch.Tensor:
    """[L, L] bool: query i sees key j when j's block is not after i's."""
    blocks = positions // block_length
    return blocks[None, :] <= blocks[:, None]


@dataclass
class Trace:
    """What the reference decided, per block: generated tokens (prompt tokens excluded),
    forwards, the pass of each token's last write; and counts across blocks."""

    blocks: list[list[int]] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    commit_rounds: list[list[int]] = field(default_factory=list)
    edits: int = 0  # positions rewritten by edits
    multi_commits: int = 0  # passes that committed more than one mask
    post_passes: int = 0  # passes begun with no mask left


def generate(forward: Forward, prompt: list[int], gen_length: int, block_length: int,
             threshold: float, mask_id: int, stop_ids: frozenset[int] = frozenset(),
             editing_threshold: float | None = None, max_post_steps: int = 16) -> Trace:
    """Decode `gen_length` tokens after `prompt` (see the module docstring). Returns the
    untrimmed blocks (a stop id or gen_length cuts them later)."""
    p, b = len(prompt), block_length
    n_blocks = -(-(p + gen_length) // b)
    x = list(prompt) + [mask_id] * (n_blocks * b - p)
    trace = Trace()
    for k in range(p // b, n_blocks):
        lo, hi = k * b, (k + 1) * b
        fixed = max(0, min(p - lo, b))  # prompt tokens at the front of the block
        last = [-1] * b

        def one_pass(r: int, lo=lo, fixed=fixed, last=last) -> int:
            return _pass(forward, x, lo, b, fixed, r, last, threshold, mask_id,
                         editing_threshold, trace)

        rounds = 0
        if editing_threshold is None:
            for _ in range(b):
                if mask_id not in x[lo:hi]:
                    break
                one_pass(rounds)
                rounds += 1
        else:
            post = 0
            while True:
                unmasked = mask_id not in x[lo:hi]
                if unmasked:
                    post += 1
                if post > max_post_steps:
                    break
                trace.post_passes += unmasked
                edited = one_pass(rounds)
                rounds += 1
                if unmasked and not edited:
                    break
        trace.blocks.append(x[lo + fixed:hi])
        trace.rounds.append(rounds)
        trace.commit_rounds.append(last[fixed:])
        if any(t in stop_ids for t in x[lo + fixed:hi]):
            break
    return trace


def _pass(forward: Forward, x: list[int], lo: int, b: int, fixed: int, r: int,
          last: list[int], threshold: float, mask_id: int, editing_threshold: float | None,
          trace: Trace) -> int:
    """One forward + mask commits + edits of the block x[lo:lo + b] (in place; `last` gets
    the pass `r` where written). Returns the number of edits."""
    hi = lo + b
    active = [x[lo + i] == mask_id for i in range(b)]
    logits = forward(torch.tensor(x[:hi]), torch.arange(hi))[lo:hi]
    conf, cand = torch.softmax(logits.float(), dim=-1).max(dim=-1)
    conf, cand = conf.tolist(), cand.tolist()
    # NOTE: torch compares an fp32 tensor with a Python float in fp32: round the bars so.
    bar = torch.tensor(threshold, dtype=torch.float32).item()
    masked = [i for i in range(b) if active[i]]
    commits = [i for i in masked if conf[i] > bar]
    if not commits and masked:
        commits = [max(masked, key=lambda i: (conf[i], -i))]
    edits = []
    if editing_threshold is not None:
        ebar = torch.tensor(editing_threshold, dtype=torch.float32).item()
        edits = [i for i in range(fixed, b) if not active[i] and cand[i] != x[lo + i]
                 and cand[i] != mask_id and conf[i] > ebar]
    assert all(cand[i] != mask_id for i in commits), "a commit wrote the mask token"
    for i in commits + edits:
        x[lo + i], last[i] = cand[i], r
    trace.edits += len(edits)
    trace.multi_commits += len(commits) > 1
    return len(edits)
