"""RMSNorm with the reference numerics: statistics in fp32, scale applied in the input dtype."""

from __future__ import annotations

import torch
from torch import nn

from dlrt.layers.fused import use_kernels


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised over the last dim.

    Follows transformers' Qwen3RMSNorm and OLMo's RMSLayerNorm (LLaDA): the normalisation is
    computed in fp32 and cast back to the input dtype before the weight multiply.
    `forward(x, residual)` first forms `residual = x + residual` (in the dtype) and normalises
    that; it returns (y, residual). On CUDA both run as one kernel (`dlrt.kernels.rms_norm`),
    which updates `residual` in place.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.dim() == 2 and use_kernels(x):
            from dlrt.kernels.rms_norm import rms_norm
            y = rms_norm(x, self.weight, self.eps, residual)
            return y if residual is None else (y, residual)
        if residual is None:
            return self.reference(x)
        return self.reference_add(x, residual)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None):
        """(y, residual) of `forward(x, residual)`; with no residual yet (the first layer) the
        stream starts at x: (norm(x), x)."""
        if residual is None:
            return self(x), x
        return self(x, residual)

    def reference_add(self, x: torch.Tensor, residual: torch.Tensor):
        """The unfused residual add + norm: (norm(x + residual), x + residual)."""
        residual = x + residual
        return self.reference(residual), residual

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)
