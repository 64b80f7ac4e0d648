"""Rotary position embedding, neox layout (rotate the two halves of the rotated dims)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """RoPE at absolute positions; theta from the config.

    `cos_sin(positions [N] int64)` -> (cos, sin) [N, R/2] fp32 with R = `rotary_dim` (default:
    the whole head_dim), computed once per forward; the attention layer's `qk_norm_rope_write`
    op applies them to each head's first R dims, the rest pass through
    (`dlrt.ops.reference.rope_rotate`). Partial RoPE (LLaDA2: R = head_dim *
    partial_rotary_factor) has the frequencies of transformers' default rope with
    `partial_rotary_factor`: inv_freq[i] = theta ** (-2i / R).
    `full_precision=True` rotates in fp32 and casts back (OLMo/LLaDA `rope_full_precision`);
    otherwise cos/sin are cast to the input dtype first (transformers' Qwen3, LLaDA2).
    """

    def __init__(self, head_dim: int, theta: float, full_precision: bool = False,
                 rotary_dim: int | None = None):
        super().__init__()
        rot = head_dim if rotary_dim is None else rotary_dim
        if not 2 <= rot <= head_dim or rot % 2:
            raise ValueError(f"rotary_dim {rot} must be even and in [2, head_dim={head_dim}]")
        self.rotary_dim = rot
        # NOTE: computed on the CPU even when the model is built on the meta device.
        exponent = torch.arange(0, rot, 2, dtype=torch.float32, device="cpu") / rot
        inv_freq = 1.0 / (theta**exponent)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.full_precision = full_precision

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, R/2] fp32
        return freqs.cos(), freqs.sin()
