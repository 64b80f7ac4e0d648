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

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                consumer: nn.Module | None = None):
        """`consumer`: the linear layer that reads y; when its method takes an FP8 W8A8 input
        (`LinearMethod.takes_fp8`), y comes quantised as a `dlrt.ops.Fp8Activation` (the
        `*_fp8` ops: one kernel with Triton) instead of a tensor."""
        fp8 = feeds_fp8(consumer, x)
        if residual is None:
            return (self.ops.rms_norm_fp8 if fp8 else self.ops.rms_norm)(x, self.weight,
                                                                         self.eps)
        return (self.ops.add_rms_norm_fp8 if fp8 else self.ops.add_rms_norm)(
            x, residual, self.weight, self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None,
                 consumer: nn.Module | None = None):
        """(y, residual) of `forward(x, residual, consumer)`; with no residual yet (the first
        layer) the stream starts at x: (norm(x), x)."""
        if residual is None:
            return self(x, consumer=consumer), x
        return self(x, residual, consumer)


def feeds_fp8(consumer: nn.Module | None, x: torch.Tensor) -> bool:
    """Whether x's successor op should hand `consumer` (a linear layer, or None) an
    `Fp8Activation` of it: x [N, K] and the consumer's method takes N rows that way."""
    method = getattr(consumer, "method", None)
    return method is not None and x.dim() == 2 and method.takes_fp8(x.shape[0])


class Fp32RMSNorm(nn.Module):
    """y = (x / sqrt(mean(x^2) + eps) * weight), all in fp32, cast to x's dtype at the end;
    normalised over the last dim; no weight (a fixed 1) when `weight=False`.

    Follows transformers' Gemma 4 / DiffusionGemma RMSNorm (`x * pow(mean + eps, -0.5)`, the
    weight multiplied in fp32 before the cast, unlike `RMSNorm`). Plain PyTorch (no op of the
    table yet). x: [..., dim] any float dtype -> the same shape and dtype.
    """

    def __init__(self, dim: int, eps: float, weight: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if weight else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            h = h * self.weight.float()
        return h.to(x.dtype)
