"""Remasking strategies in tensor form: which masked positions a round commits.

Every strategy maps (confidence [n] fp32, masked [n] bool, quota k) to commit [n] bool with no
host sync and fixed shapes, so the same code runs eagerly and inside a captured CUDA graph.
Guarantees for all: commit is a subset of masked; at least one position is committed while any
is masked. Quota-based strategies commit min(k, masks left) positions, at least one.
Definitions follow DESIGN §3.6 (SDAR `generate.py`, dInfer, Fast-dLLM, EB-sampler; `threshold`
is LLaDA2's `generate()` rule with one token to transfer).

- `sequential`: the leftmost k masked positions.
- `low_confidence_static`: the k masked positions of highest p.
- `low_confidence_dynamic`: every masked p > threshold; if fewer than k, the top k by p.
- `threshold`: every masked p > threshold (strictly); if none, the single most confident
  masked position. The quota is not used; threshold 0 commits every masked p > 0.
- `entropy_bounded`: by ascending entropy, the longest prefix whose summed entropy stays
  < eb_threshold (at least one).
- `dynamic_pmax`: by descending p, the longest prefix whose product of p stays >= threshold
  (at least one).
- `random`: k masked positions drawn uniformly (counter-based scores).
Ties go to the lower index everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.errors import OptionError

STRATEGIES = (
    "sequential",
    "low_confidence_static",
    "low_confidence_dynamic",
    "threshold",
    "entropy_bounded",
    "dynamic_pmax",
    "random",
)
NEEDS_ENTROPY = {"entropy_bounded"}
NEEDS_RANDOM = {"random"}
USES_QUOTA = {"sequential", "low_confidence_static", "low_confidence_dynamic", "random"}


@dataclass(frozen=True)
class StrategySpec:
    name: str
    threshold: float  # low_confidence_dynamic, threshold, dynamic_pmax
    eb_threshold: float  # entropy_bounded

    def __post_init__(self):
        if self.name not in STRATEGIES:
            raise OptionError(f"unknown remasking_strategy {self.name!r}; one of {STRATEGIES}")


def _rank(score: torch.Tensor, descending: bool) -> torch.Tensor:
    """Rank of every position by score (0 = first); ties broken by lower index."""
    order = torch.sort(score, descending=descending, stable=True).indices
    return torch.argsort(order)


def _prefix_count(ok_sorted: torch.Tensor, masked_count: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True in ok_sorted, clamped to [1, masked_count]."""
    run = torch.cumprod(ok_sorted.to(torch.int64), dim=0).sum()
    return torch.minimum(torch.clamp(run, min=1), masked_count)


def select(spec: StrategySpec, conf: torch.Tensor, masked: torch.Tensor, quota,
           entropy: torch.Tensor | None = None, rand: torch.Tensor | None = None) -> torch.Tensor:
    """Positions to commit this round.

    Args:
        conf: [n] fp32 confidence of each position's candidate (ignored where not masked).
        masked: [n] bool, positions still holding the mask token.
        quota: int or 0-d int64 tensor, this round's quota k (clamped to [1, masks left]).
        entropy: [n] fp32, needed by `entropy_bounded`.
        rand: [n] fp32 uniform scores, needed by `random`.
    Returns:
        [n] bool commit mask.
    """
    n_masked = masked.sum()
    k = torch.minimum(torch.clamp(torch.as_tensor(quota, device=conf.device), min=1), n_masked)
    neg = torch.full_like(conf, float("-inf"))
    score = torch.where(masked, conf, neg)
    name = spec.name
    if name == "sequential":
        return masked & (torch.cumsum(masked.to(torch.int64), 0) <= k)
    if name == "random":
        return masked & (_rank(torch.where(masked, rand, neg), True) < k)
    top_k = masked & (_rank(score, True) < k)
    if name == "low_confidence_static":
        return top_k
    if name == "low_confidence_dynamic":
        high = masked & (conf > spec.threshold)
        return torch.where(high.sum() >= k, high, top_k)
    if name == "threshold":
        high = masked & (conf > spec.threshold)
        return torch.where(high.any(), high, masked & (_rank(score, True) < 1))
    if name == "dynamic_pmax":
        rank = _rank(score, True)
        p_sorted = torch.sort(torch.where(masked, conf, torch.zeros_like(conf)),
                              descending=True, stable=True).values
        count = _prefix_count(torch.cumprod(p_sorted, 0) >= spec.threshold, n_masked)
        return masked & (rank < count)
    if name == "entropy_bounded":
        h = torch.where(masked, entropy, torch.full_like(entropy, float("inf")))
        rank = _rank(h, False)
        cum = torch.cumsum(torch.sort(h, stable=True).values, 0)
        count = _prefix_count(cum < spec.eb_threshold, n_masked)
        return masked & (rank < count)
    raise AssertionError(name)
