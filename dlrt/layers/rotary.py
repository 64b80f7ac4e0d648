"""Rotary position embedding, neox layout (rotate the two halves of each head)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """RoPE at absolute positions; theta from the config.

    `cos_sin(positions [N] int64)` -> (cos, sin) [N, D/2] fp32, computed once per forward;
    `rotate(x [N, H, D], cos, sin)` applies it. `full_precision=True` rotates in fp32 and casts
    back (OLMo/LLaDA `rope_full_precision`); otherwise cos/sin are cast to the input dtype first
    (transformers' Qwen3). The fused kernel (`dlrt.kernels.rope`) follows the same numerics.
    """

    def __init__(self, head_dim: int, theta: float, full_precision: bool = False):
        super().__init__()
        # NOTE: computed on the CPU even when the model is built on the meta device.
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
        inv_freq = 1.0 / (theta**exponent)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.full_precision = full_precision

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, D/2] fp32
        return freqs.cos(), freqs.sin()

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        cos = torch.cat((cos, cos), dim=-1)[:, None, :]  # [N, 1, D]
        sin = torch.cat((sin, sin), dim=-1)[:, None, :]
        if self.full_precision:
            x = x.float()
        else:
            cos, sin = cos.to(dtype), sin.to(dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * cos + rotated * sin).to(dtype)
