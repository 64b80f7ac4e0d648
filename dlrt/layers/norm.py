"""RMSNorm with an optional residual add before it (numerics: `dlrt.ops.reference.rms_norm`)."""

from __future__ import annotations

import torch
from torch import nn

from dlrt.ops import Ops


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised over the last dim.

    Follows transformers' Qwen3RMSNorm and OLMo's RMSLayerNorm (LLaDA): statistics in fp32,
    cast back to the input dtype before the weight multiply. `forward(x, residual)` first forms
    `residual = x + residual` (in the dtype) and normalises that; it returns (y, residual).
    The work is the ops table's (`rms_norm`, `add_rms_norm`: one kernel with Triton).
    """

    def __init__(self, dim: int, eps: float, ops: Ops):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None):
        """(y, residual) of `forward(x, residual)`; with no residual yet (the first layer) the
        stream starts at x: (norm(x), x)."""
        if residual is None:
            return self(x), x
        return self(x, residual)
