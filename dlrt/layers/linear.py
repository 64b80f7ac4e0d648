"""Projections of one input merged into one weight (fused QKV, fused gate-up)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MergedLinear(nn.Module):
    """Bias-free projections of the same input stacked in one weight [sum(outs), in].

    `parts` maps checkpoint sub-module names to output sizes, in order; the checkpoint tensor
    `<parent>.<part>.weight` fills its row range (`dlrt.checkpoint.loader`). x: [N, in] ->
    [N, sum(outs)], one GEMM instead of one per part.
    """

    def __init__(self, in_features: int, parts: dict[str, int]):
        super().__init__()
        self.parts = tuple(parts.items())
        self.weight = nn.Parameter(torch.empty(sum(parts.values()), in_features))

    def ranges(self) -> list[tuple[str, int, int]]:
        """(part name, first row, end row) of each part."""
        out, lo = [], 0
        for name, size in self.parts:
            out.append((name, lo, lo + size))
            lo += size
        return out

    def part(self, name: str) -> torch.Tensor:
        """The rows of one part: a view [out, in]."""
        for n, lo, hi in self.ranges():
            if n == name:
                return self.weight[lo:hi]
        raise KeyError(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)
