"""Rotary position embedding, neox layout (rotate the two halves of each head)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """RoPE at absolute positions; theta from the config.

    `cos_sin(positions [N] int64)` -> (cos, sin) [N, D/2] fp32, computed once per forward; the
    attention layer's `qk_norm_rope_write` op applies them (`dlrt.ops.reference.rope_rotate`).
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

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, D/2] fp32
        return freqs.cos(), freqs.sin()
