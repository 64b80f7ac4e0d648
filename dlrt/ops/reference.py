"""The ops in plain PyTorch: the numerics every kernel follows, and the CPU path.

RMSNorm follows transformers' Qwen3RMSNorm and OLMo's RMSLayerNorm (LLaDA): statistics in
fp32, the normalised row cast back to the input dtype before the weight multiply. RoPE is the
neox layout (rotate the two halves of each head's rotated dims: all, or the first R with
partial RoPE); `full_precision` rotates in fp32 and casts back (OLMo/LLaDA
`rope_full_precision`), otherwise cos/sin are cast to the input dtype first (transformers'
Qwen3, LLaDA2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlrt.decoding.round import reference_candidates
from dlrt.ops import Ops


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)) over the last dim, in x.dtype."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum rounded to the dtype."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused gate-up output [..., 2I] -> [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                full_precision: bool) -> torch.Tensor:
    """Neox RoPE of x [N, H, D] with cos, sin [N, R/2] fp32; returns x.dtype.

    R = 2 * cos.shape[-1] <= D dims are rotated; with R < D (partial RoPE, LLaDA2 /
    transformers' `apply_rotary_pos_emb` with a shorter cos) dims R..D-1 pass through."""
    rot = 2 * cos.shape[-1]
    if rot < x.shape[-1]:
        rotated = rope_rotate(x[..., :rot], cos, sin, full_precision)
        return torch.cat((rotated, x[..., rot:]), dim=-1)
    dtype = x.dtype
    cos = torch.cat((cos, cos), dim=-1)[:, None, :]  # [N, 1, D]
    sin = torch.cat((sin, sin), dim=-1)[:, None, :]
    if full_precision:
        x = x.float()
    else:
        cos, sin = cos.to(dtype), sin.to(dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(dtype)


def paged_slots(page_table: torch.Tensor, page_size: int,
                positions: torch.Tensor) -> torch.Tensor:
    """Flat cache slot [n] int64 of each position [n] (token t: page `page_table[t // page]`,
    slot `t % page`)."""
    return page_table[positions // page_size].long() * page_size + positions % page_size


def paged_write(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write k, v [n, Hkv, D] at `positions` into one layer's cache [pages, page, Hkv, D]."""
    slots = paged_slots(page_table, k_cache.shape[1], positions)
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slots, v)


def qk_norm_rope_write(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                       q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                       cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                       full_precision: bool) -> torch.Tensor:
    """Split the fused QKV [N, (Hq + 2 Hkv) D]; per-head RMSNorm of q and k over all D dims
    (when the weights are given), RoPE of the first R = 2 * cos.shape[-1] dims (cos, sin
    [N, R/2] fp32), k and v written into the cache at `positions`; returns q [N, Hq, D]."""
    n, d = qkv.shape[0], head_dim
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q, k = q.reshape(n, -1, d), k.reshape(n, -1, d)
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    q, k = rope_rotate(q, cos, sin, full_precision), rope_rotate(k, cos, sin, full_precision)
    paged_write(k_cache, v_cache, page_table, positions, k, v.reshape(n, -1, d))
    return q


OPS = Ops("reference", rms_norm=rms_norm, add_rms_norm=add_rms_norm, silu_and_mul=silu_and_mul,
          qk_norm_rope_write=qk_norm_rope_write, candidates=reference_candidates)
