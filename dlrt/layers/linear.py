"""Dense projections: one entry point (`linear`) that picks cuBLAS or the skinny Triton GEMM
per weight shape, a bias-free `Linear`, and merged projections (fused QKV, fused gate-up)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.layers.fused import use_kernels

# (N, K, dtype) -> GemmConfig of the skinny GEMM, or None for cuBLAS; filled at load by
# `dlrt.kernels.gemm_select.tune` (CUDA only).
CHOICES: dict[tuple, object] = {}


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T -> [..., N]. A few rows on CUDA (up to the chosen config's
    `max_rows`: 16, or 4 for the GEMV) take the Triton kernel where it was timed faster for
    this shape; everything else is `F.linear`."""
    if CHOICES and x.dim() == 2 and x.shape[0] <= 16 and use_kernels(x):
        cfg = CHOICES.get((weight.shape[0], weight.shape[1], weight.dtype))
        if cfg is not None and x.shape[0] <= cfg.max_rows():
            from dlrt.kernels.skinny_gemm import skinny_gemm
            return skinny_gemm(x.contiguous(), weight, cfg)
    return F.linear(x, weight)


class Linear(nn.Linear):
    """Bias-free nn.Linear whose forward goes through `linear`."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


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
        return linear(x, self.weight)
