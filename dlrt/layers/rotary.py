"""Rotary position embedding, neox layout (rotate the two halves of the rotated dims)."""

from __future__ import annotations

import torch
from torch import nn

from dlrt.ops.reference import rope_rotate


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
    Proportional RoPE (`pairs`=P: Gemma 4, DiffusionGemma's full-attention layers,
    transformers' "proportional" rope): R = head_dim and only the first P of the D/2 pairs
    turn, inv_freq[i] = theta ** (-2i / D) for i < P and 0 after (cos 1, sin 0: those pass
    through unchanged).
    """

    def __init__(self, head_dim: int, theta: float, full_precision: bool = False,
                 rotary_dim: int | None = None, pairs: int | None = None):
        super().__init__()
        rot = head_dim if rotary_dim is None else rotary_dim
        if not 2 <= rot <= head_dim or rot % 2:
            raise ValueError(f"rotary_dim {rot} must be even and in [2, head_dim={head_dim}]")
        if pairs is not None and (rotary_dim is not None or not 0 <= pairs <= head_dim // 2):
            raise ValueError(f"pairs {pairs} must be in [0, head_dim / 2 = {head_dim // 2}], "
                             "without rotary_dim")
        self.rotary_dim = rot
        # NOTE: computed on the CPU even when the model is built on the meta device.
        turning = rot // 2 if pairs is None else pairs
        exponent = torch.arange(0, 2 * turning, 2, dtype=torch.float32, device="cpu") / rot
        inv_freq = torch.cat((1.0 / (theta**exponent), torch.zeros(rot // 2 - turning,
                                                                    device="cpu")))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.full_precision = full_precision

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, R/2] fp32
        return freqs.cos(), freqs.sin()

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, H, D] rotated with `cos_sin`'s tables (its first R dims; the reference op
        `dlrt.ops.reference.rope_rotate`), in x's dtype: for layers that apply RoPE
        themselves instead of through the fused `qk_norm_rope_write`."""
        return rope_rotate(x, cos, sin, self.full_precision)
