"""A dense decoder layer as four GEMVs with its small ops inside them (CUDA, <= 4 rows).

The classic layer runs ten kernels: add+RMSNorm, QKV, q/k norm + RoPE, attention (two), o_proj,
add+RMSNorm, gate-up, SiLU-and-mul, down. Each kernel boundary costs the GPU a few
microseconds of ramp and drain, which for a block of 4 rows is comparable to streaming a small
weight. Here the norms run in the prologue of the projection they feed, SiLU-and-mul in the
prologue of down_proj, and each residual add in the epilogue of the projection before it
(`dlrt.kernels.skinny_gemm.gemv`), leaving seven kernels:

    qkv   = gemv(s, W_qkv, norm=attn_norm)          s: the residual stream
    s     = gemv(attend(qkv), W_o, residual=s)
    gu    = gemv(s, W_gate_up, norm=mlp_norm)
    s     = gemv(gu, W_down, silu=True, residual=s)

Every op is rounded where the unfused ops round (only fp32 summation order differs), so the
layer computes what the classic one does. The layer returns (stream, None): the next layer's
norm sees "no residual yet" and takes the stream as is, as the first layer does.
`dlrt.kernels.gemm_select.tune` times this against the classic layer and sets
`LayerGEMVs` on every dense layer when it is faster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dlrt.layers.fused import use_kernels
from dlrt.layers.norm import RMSNorm

if TYPE_CHECKING:  # the kernels need Triton, which CPU-only installs may lack
    from dlrt.kernels.skinny_gemm import GemmConfig


@dataclass(frozen=True)
class LayerGEMVs:
    """The GEMV config ("fma") of each projection of a dense layer."""

    qkv: GemmConfig
    o: GemmConfig
    gate_up: GemmConfig
    down: GemmConfig


@dataclass(frozen=True)
class DenseWeights:
    """What the fused layer reads of a dense layer: its two norms and four weights [N, K]
    (gate_up is [gate | up], as `MergedLinear` stacks them)."""

    attn_norm: RMSNorm
    qkv: torch.Tensor
    o: torch.Tensor
    mlp_norm: RMSNorm
    gate_up: torch.Tensor
    down: torch.Tensor


def applies(gemvs: LayerGEMVs | None, x: torch.Tensor) -> bool:
    """Whether a forward of x [N, H] takes the fused layer: configs set, CUDA kernels on, and
    at most 4 rows (prefill and the folded first round take the classic layer)."""
    if gemvs is None or x.dim() != 2 or not use_kernels(x):
        return False
    from dlrt.kernels.skinny_gemm import FMA_ROWS
    return x.shape[0] <= FMA_ROWS


def forward(x: torch.Tensor, residual: torch.Tensor | None, w: DenseWeights,
            gemvs: LayerGEMVs, attend: Callable[[torch.Tensor], torch.Tensor]):
    """One dense layer: (x [N, H], residual [N, H] or None) -> (stream [N, H], None).

    `attend(qkv [N, (Hq + 2 Hkv) D]) -> [N, Hq D]` is the attention between the QKV and output
    projections (q/k norm, RoPE, K/V cache write, attention)."""
    from dlrt.kernels.skinny_gemm import gemv

    s = (x if residual is None else x + residual).contiguous()
    qkv = gemv(s, w.qkv, gemvs.qkv, norm=w.attn_norm.weight, eps=w.attn_norm.eps)
    s = gemv(attend(qkv).contiguous(), w.o, gemvs.o, residual=s)
    gu = gemv(s, w.gate_up, gemvs.gate_up, norm=w.mlp_norm.weight, eps=w.mlp_norm.eps)
    return gemv(gu, w.down, gemvs.down, silu=True, residual=s), None
