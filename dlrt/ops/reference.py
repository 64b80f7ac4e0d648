"""The ops in plain PyTorch: the numerics every kernel follows, and the CPU path.

RMSNorm follows transformers' Qwen3RMSNorm and OLMo's RMSLayerNorm (LLaDA): statistics in
fp32, the normalised row cast back to the input dtype before the weight multiply. RoPE is the
neox layout (rotate the two halves of each head's rotated dims: all, or the first R with
partial RoPE); `full_precision` rotates in fp32 and casts back (OLMo/LLaDA
`rope_full_precision`), otherwise cos/sin are cast to the input dtype first (transformers'
Qwen3, LLaDA2).

An FP8 KV cache (float8_e4m3fn) holds K and V divided by a per-layer fp32 scale: stored =
clamp(x / scale, -448, 448) rounded to nearest even (`quantize_kv`), read back as
stored * scale (`dequantize_kv`); every write of the cache goes through `paged_write`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlrt.decoding.renoise import denoiser_draw
from dlrt.decoding.round import reference_candidates
from dlrt.ops import Fp8Activation, Ops


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


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> Fp8Activation:
    """`rms_norm` quantised for an FP8 W8A8 layer (`Fp8Activation.quantize`)."""
    return Fp8Activation.quantize(rms_norm(x, weight, eps))


def add_rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[Fp8Activation, torch.Tensor]:
    """`add_rms_norm` with its normalised output quantised (`Fp8Activation.quantize`)."""
    y, residual = add_rms_norm(x, residual, weight, eps)
    return Fp8Activation.quantize(y), residual


def silu_and_mul_fp8(gate_up: torch.Tensor) -> Fp8Activation:
    """`silu_and_mul` quantised for an FP8 W8A8 layer (`Fp8Activation.quantize`)."""
    return Fp8Activation.quantize(silu_and_mul(gate_up))


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


KV_FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """K or V for an FP8 cache: clamp(x / scale, -448, 448) cast to float8_e4m3fn (round to
    nearest even); the division in fp32. x: any shape and float dtype; scale: fp32 scalar
    tensor (shape [] or [1]) on x's device. Returns float8_e4m3fn of x's shape."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(KV_FP8)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values of an FP8 cache: x.float() * scale (fp32) cast to `dtype`."""
    return (x.float() * scale).to(dtype)


def paged_write(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None
                ) -> None:
    """Write k, v [n, Hkv, D] at `positions` into one layer's cache [pages, page, Hkv, D].

    An FP8 cache (float8_e4m3fn) stores `quantize_kv(k, k_scale)` and `quantize_kv(v,
    v_scale)` (scales: fp32 scalar tensors); other caches store k and v as they are.

    Raises:
        ValueError: an FP8 cache without its scales.
    """
    slots = paged_slots(page_table, k_cache.shape[1], positions)
    for cache, x, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        if cache.dtype == KV_FP8:
            if scale is None:
                raise ValueError("an FP8 KV cache is written with its k_scale and v_scale")
            # NOTE: index_copy_ has no float8 kernels; the bytes are copied.
            cache, x = cache.view(torch.uint8), quantize_kv(x, scale).view(torch.uint8)
        cache.view(-1, *x.shape[1:]).index_copy_(0, slots, x)


def qk_norm_rope_write(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                       q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                       cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                       full_precision: bool, k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Split the fused QKV [N, (Hq + 2 Hkv) D]; per-head RMSNorm of q and k over all D dims
    (when the weights are given), RoPE of the first R = 2 * cos.shape[-1] dims (cos, sin
    [N, R/2] fp32), k and v written into the cache at `positions` (`paged_write`: an FP8
    cache stores them divided by k_scale / v_scale); returns q [N, Hq, D]."""
    n, d = qkv.shape[0], head_dim
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q, k = q.reshape(n, -1, d), k.reshape(n, -1, d)
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    q, k = rope_rotate(q, cos, sin, full_precision), rope_rotate(k, cos, sin, full_precision)
    paged_write(k_cache, v_cache, page_table, positions, k, v.reshape(n, -1, d), k_scale,
                v_scale)
    return q


def soft_embedding(logits: torch.Tensor, weight: torch.Tensor, scale=1.0) -> torch.Tensor:
    """(softmax(logits, fp32).to(weight.dtype) @ weight) * scale.to(weight.dtype): logits
    [n, V] any float dtype, weight [V, d]; [n, d] in weight's dtype. DiffusionGemma's soft
    embeddings (transformers' self-conditioning input, with its casts); scale a number or a
    0-d CPU tensor (made an fp32 tensor first, as the model's `embed_scale` buffer holds it)."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)  # [n, V] fp32
    scale = torch.as_tensor(scale, dtype=torch.float32).to(weight.dtype)
    return (probs.to(weight.dtype) @ weight) * scale


OPS = Ops("reference", rms_norm=rms_norm, add_rms_norm=add_rms_norm, silu_and_mul=silu_and_mul,
          qk_norm_rope_write=qk_norm_rope_write, candidates=reference_candidates,
          rms_norm_fp8=rms_norm_fp8, add_rms_norm_fp8=add_rms_norm_fp8,
          silu_and_mul_fp8=silu_and_mul_fp8, soft_embedding=soft_embedding,
          denoiser_draw=denoiser_draw)
