"""One denoising round after the forward: candidates, confidences, remasking strategy, commit.

Pure tensor code with fixed shapes (no `.item()`, no data-dependent Python branches), shared by
every decoder and execution mode so they commit the same tokens. Rounds on CUDA take the
candidates and confidences straight from the logits: greedy from `dlrt.kernels.greedy`, sampled
from `dlrt.kernels.sampling` (except strategies that need the entropy of the probabilities).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.decoding import rng
from dlrt.decoding.sampling import SamplingSpec, candidates, entropy, probabilities
from dlrt.decoding.strategies import NEEDS_ENTROPY, NEEDS_RANDOM, StrategySpec, select
from dlrt.layers.fused import use_kernels


@dataclass(frozen=True)
class RoundSpec:
    """What every round of a request shares."""

    strategy: StrategySpec
    sampling: SamplingSpec
    steps: int  # the round budget T; the last round commits every remaining mask


def fused_candidates(logits: torch.Tensor, sampling: SamplingSpec, seed, round_idx,
                     positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidates [n] int64, confidences [n] fp32) of logits [n, V] from the Triton kernels,
    without fp32 [n, V] probabilities: greedy (`dlrt.kernels.greedy`) at temperature 0, else
    the sampled draw (`dlrt.kernels.sampling`), equal to `candidates(probabilities(...))`.
    seed, round_idx: ints or 0-d int64 device tensors."""
    logits = logits.contiguous()
    if sampling.temperature == 0:
        from dlrt.kernels.greedy import greedy_candidates
        return greedy_candidates(logits)
    from dlrt.kernels.sampling import sample_candidates
    return sample_candidates(logits, sampling.temperature, sampling.top_k, sampling.top_p, seed,
                             round_idx, positions)


def denoise_round(spec: RoundSpec, logits: torch.Tensor, tokens: torch.Tensor,
                  masked: torch.Tensor, positions: torch.Tensor, round_idx, quota,
                  steps=None, seed=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Commit some masked positions of a block.

    Args:
        logits: [n, V] logits at the block positions (any float dtype).
        tokens: [n] int64 current ids (mask token where masked).
        masked: [n] bool, positions not yet decided (fixed prompt tokens are False).
        positions: [n] int64 absolute positions (keys of the sampling noise).
        round_idx: int or 0-d int64 tensor, round within the block (0-based).
        quota: int or 0-d int64 tensor, this round's quota k.
        steps, seed: override `spec.steps` / `spec.sampling.seed` (ints or device tensors, so
            one captured graph serves every request).
    Returns:
        (tokens [n] int64, masked [n] bool, commit [n] bool) after the round.
    """
    seed = spec.sampling.seed if seed is None else seed
    steps = spec.steps if steps is None else steps
    ent = None
    if spec.strategy.name not in NEEDS_ENTROPY and logits.dim() == 2 and use_kernels(logits):
        cand, conf = fused_candidates(logits, spec.sampling, seed, round_idx, positions)
    else:
        probs = probabilities(logits, spec.sampling)  # [n, V] fp32
        cand, conf = candidates(probs, spec.sampling, round_idx, positions, seed)
        if spec.strategy.name in NEEDS_ENTROPY:
            ent = entropy(probs)
    rand = None
    if spec.strategy.name in NEEDS_RANDOM:
        rand = rng.uniform(seed, rng.REMASK_STREAM, round_idx, positions, 1)[:, 0]
    commit = select(spec.strategy, conf, masked, quota, ent, rand)
    last = torch.as_tensor(round_idx, device=masked.device) >= steps - 1
    commit = commit | (masked & last)
    return torch.where(commit, cand, tokens), masked & ~commit, commit
