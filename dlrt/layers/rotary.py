"""Rotary position embedding, neox layout (rotate the two halves of each head)."""

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k at absolute positions.

    q: [N, Hq, D], k: [N, Hkv, D], positions: [N] int64. theta from the config.
    `full_precision=True` rotates in fp32 and casts back (OLMo/LLaDA `rope_full_precision`);
    otherwise cos/sin are cast to the input dtype first (transformers' Qwen3).
    """

    def __init__(self, head_dim: int, theta: float, full_precision: bool = False):
        super().__init__()
        # NOTE: computed on the CPU even when the model is built on the meta device.
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
        inv_freq = 1.0 / (theta**exponent)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.full_precision = full_precision

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, D/2] fp32
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [N, 1, D]
        cos, sin = emb.cos(), emb.sin()
        return _rotate(q, cos, sin, self.full_precision), _rotate(k, cos, sin, self.full_precision)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    dtype = x.dtype
    if fp32:
        x = x.float()
    else:
        cos, sin = cos.to(dtype), sin.to(dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(dtype)
