"""RMSNorm with the reference numerics: statistics in fp32, scale applied in the input dtype."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised over the last dim.

    Follows transformers' Qwen3RMSNorm and OLMo's RMSLayerNorm (LLaDA): the normalisation is
    computed in fp32 and cast back to the input dtype before the weight multiply.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)
