"""Dense projections: one entry point (`linear`) that picks cuBLAS or the skinny Triton GEMM
per weight shape, a bias-free `Linear`, merged projections (fused QKV, fused gate-up), and the
chain of L2 prefetches from each projection to the next (`plan`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.layers.fused import use_kernels

# (N, K, dtype) -> GemmConfig of the skinny GEMM, or None for cuBLAS; filled at load by
# `dlrt.kernels.gemm_select.tune` (CUDA only).
CHOICES: dict[tuple, object] = {}


def linear(x: torch.Tensor, weight: torch.Tensor,
           prefetch: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T -> [..., N]. A few rows on CUDA (up to the chosen config's
    `max_rows`: 16, or 4 for the GEMV) take the Triton kernel where it was timed faster for
    this shape; everything else is `F.linear`. With `prefetch` = (next weight, bytes), a
    forward of at most 16 rows on CUDA then asks the L2 for that many bytes of the next
    projection's weight (`dlrt.kernels.l2_prefetch`; a hint, values unchanged)."""
    y = _project(x, weight)
    if prefetch is not None and x.dim() == 2 and x.shape[0] <= 16 and use_kernels(x):
        from dlrt.kernels import l2_prefetch
        l2_prefetch.prefetch(*prefetch)
    return y


def _project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
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
        self.prefetch: tuple[torch.Tensor, int] | None = None  # set by `plan`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.prefetch)


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
        self.prefetch: tuple[torch.Tensor, int] | None = None  # set by `plan`

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
        return linear(x, self.weight, self.prefetch)


def plan(model: nn.Module, nbytes: int) -> list[tuple[str, str]]:
    """Chain the model's projections for the L2 prefetch: each `Linear` / `MergedLinear`, in
    registration order (the order a forward runs them in: a layer's QKV, output, gate-up and
    down, then the next layer's, then the LM head), prefetches the first `nbytes` of the next
    one's weight after its own product; the last one (the LM head) prefetches the first, for
    the next round. A weight tied to an earlier one (an LM head tied to the embedding) keeps
    its place. nbytes <= 0 removes the chain.

    Returns:
        (module name, name of the module whose weight it prefetches), in order.
    """
    mods = [(name, m) for name, m in model.named_modules()
            if isinstance(m, (Linear, MergedLinear))]
    for _, m in mods:
        m.prefetch = None
    if nbytes <= 0 or len(mods) < 2:
        return []
    out = []
    for (name, m), (nxt_name, nxt) in zip(mods, mods[1:] + mods[:1], strict=True):
        m.prefetch = (nxt.weight, int(nbytes))
        out.append((name, nxt_name))
    return out
