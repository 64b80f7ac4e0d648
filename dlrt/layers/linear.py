"""Bias-free linear layers, each computing through the `LinearMethod` it holds
(`dlrt.layers.quant`; cuBLAS until a load-time plan sets another): `Linear`, and merged
projections of the same input (fused QKV, fused gate-up) as `MergedLinear`."""

from __future__ import annotations

import torch
from torch import nn

from dlrt.layers.quant import LinearMethod
from dlrt.layers.quant.unquantized import CUBLAS


class LinearBase(nn.Module):
    """weight [out, in]; `method` computes x [..., in] -> [..., out].

    Under tensor parallelism (`dlrt.distributed.transform`) the weight is this rank's rows (column
    parallel) or columns (row parallel) and `shards` says which; a row-parallel layer's
    output is a partial sum and `reduce` (the ranks' all-reduce) completes it.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.method: LinearMethod = CUBLAS
        self.shards: dict = {}  # parameter name -> `dlrt.layers.shard.Shard`
        self.reduce = None  # x -> the sum of x over the ranks, or None (not row parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.method.apply(self, x)
        return y if self.reduce is None else self.reduce(y)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, method={self.method.name}"


class Linear(LinearBase):
    """One projection; its checkpoint tensor is `<name>.weight`."""


class MergedLinear(LinearBase):
    """Bias-free projections of the same input stacked in one weight [sum(outs), in].

    `parts` maps checkpoint sub-module names to output sizes, in order; the checkpoint tensor
    `<parent>.<part>.weight` fills its row range (`dlrt.checkpoint.loader`). x: [N, in] ->
    [N, sum(outs)], one GEMM instead of one per part.
    """

    def __init__(self, in_features: int, parts: dict[str, int]):
        super().__init__(in_features, sum(parts.values()))
        self.parts = tuple(parts.items())

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
