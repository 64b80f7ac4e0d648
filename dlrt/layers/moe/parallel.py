"""Expert parallelism: a rank holds experts [first, first + E_local) of the layer's E and
computes their share of the routed sum; the layer's `reduce` adds the ranks' shares."""

from __future__ import annotations

import torch

from dlrt.layers.moe.base import MoEMethod


class ExpertParallel(MoEMethod):
    """Wraps the method that computes experts (`inner`): routing is the full router's on every
    rank (replicated, so every rank sees the same choices); `apply` keeps the pairs whose
    expert lives here (local id = id - first) and gives the others weight 0 and local expert 0,
    so the shapes stay fixed (capturable) and the zero-weight pairs add nothing. Summed over
    the ranks, every pair counts once.

    Args:
        inner: the method of the unsharded layer (reference or Triton).
        first: checkpoint id of the rank's first expert; count: experts on the rank.
    """

    def __init__(self, inner: MoEMethod, first: int, count: int):
        self.inner, self.first, self.count = inner, first, count
        self.name = f"{inner.name}+ep"

    def route(self, layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.route(layer, x)

    def select(self, spec, logits, expert_bias=None, expert_scale=None):
        return self.inner.select(spec, logits, expert_bias, expert_scale)

    def apply(self, layer, x: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        here = (local >= 0) & (local < self.count)
        return self.inner.apply(layer, x, torch.where(here, weights, torch.zeros_like(weights)),
                                torch.where(here, local, torch.zeros_like(local)))
