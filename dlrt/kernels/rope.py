"""Per-head q/k RMSNorm + neox RoPE + K/V write into the paged cache, one kernel per layer.

Input is the fused QKV projection [N, (Hq + 2 Hkv) * D]. Program (token t, head h): for a query
head it normalises (when the model has q/k norms), rotates and stores the query; for a KV head
it normalises and rotates k and copies v into the cache slot of the token's position. Partial
RoPE (LLaDA2): only the first ROT < D dims are rotated (neox halves of those ROT), the other
D - ROT are normalised with the rest (the norm is over all D) and stored unrotated; ROT = D
(the default) is the full rotation, compiled without the pass-through part.

Numerics follow the reference layers (`dlrt.layers.norm.RMSNorm`, `dlrt.layers.rotary`): the
norm is taken in fp32 and cast to the dtype before the weight multiply; RoPE either casts
cos/sin to the dtype and rounds each product and the sum (transformers' Qwen3), or rotates in
fp32 and casts once (`full_precision`, OLMo/LLaDA). Products are not contracted into FMAs, so
the fp32 rounding matches the unfused ops. An FP8 cache (float8_e4m3fn, KV_FP8) receives k and
v rounded to the dtype, then divided by the layer's scale (read from device memory) and rounded
to e4m3 (`dlrt.kernels.e4m3`): the bytes `dlrt.ops.reference.quantize_kv` gives.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl
from dlrt.kernels.e4m3 import quantize_e4m3


@triton.jit
def _rot_half(a, b, c, s, FP32_ROPE: tl.constexpr, dtype: tl.constexpr):
    """(a * c - b * s) rounded like the reference: a, b the two halves, c, s cos/sin."""
    if FP32_ROPE:
        return a * c + (-b) * s
    c = c.to(dtype).to(tl.float32)
    s = s.to(dtype).to(tl.float32)
    return ((a * c).to(dtype).to(tl.float32) + ((-b) * s).to(dtype).to(tl.float32))


@triton.jit
def _scaled(x, r, w, dtype: tl.constexpr):
    """w * (x * r), rounded to the dtype at the reference's two points."""
    return (w * (x * r).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit
def _head_norm(x1, x2, xp, p_mask, w_ptr, eps, HALF: tl.constexpr, D: tl.constexpr,
               ROT: tl.constexpr, PASS: tl.constexpr, dtype: tl.constexpr):
    """RMSNorm of one head over all D dims: the rotated halves x1, x2 [ROT/2] and, with
    partial RoPE, the pass-through dims xp [PASS] (masked by p_mask; unused when ROT = D)."""
    d = tl.arange(0, HALF)
    if ROT < D:
        ss = tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0) + tl.sum(xp * xp, axis=0)
    else:
        ss = tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)
    r = tl.math.rsqrt(ss / D + eps)
    y1 = _scaled(x1, r, tl.load(w_ptr + d).to(tl.float32), dtype)
    y2 = _scaled(x2, r, tl.load(w_ptr + HALF + d).to(tl.float32), dtype)
    if ROT < D:
        p = tl.arange(0, PASS)
        xp = _scaled(xp, r, tl.load(w_ptr + ROT + p, mask=p_mask, other=0.0).to(tl.float32),
                     dtype)
    return y1, y2, xp


@triton.jit
def _store(ptr, x, mask, scale, FP8: tl.constexpr, dtype: tl.constexpr):
    """Store fp32 x rounded to the dtype; into an FP8 cache (a uint8 view), the e4m3 code of
    that value / scale."""
    x = x.to(dtype)
    if FP8:
        tl.store(ptr, quantize_e4m3(x.to(tl.float32), scale), mask=mask)
    else:
        tl.store(ptr, x, mask=mask)


@triton.jit
def _store_head(out, x1, x2, xp, p_mask, c, s, scale, HALF: tl.constexpr, D: tl.constexpr,
                ROT: tl.constexpr, PASS: tl.constexpr, FP32_ROPE: tl.constexpr,
                FP8: tl.constexpr, dtype: tl.constexpr):
    """Rotate the first ROT dims and store the head at `out`; dims ROT..D-1 as they are."""
    d = tl.arange(0, HALF)
    _store(out + d, _rot_half(x1, x2, c, s, FP32_ROPE, dtype), None, scale, FP8, dtype)
    _store(out + HALF + d, _rot_half(x2, -x1, c, s, FP32_ROPE, dtype), None, scale, FP8, dtype)
    if ROT < D:
        _store(out + ROT + tl.arange(0, PASS), xp, p_mask, scale, FP8, dtype)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, page_table_ptr,
                         k_cache_ptr, v_cache_ptr, q_out_ptr, k_scale_ptr, v_scale_ptr, eps,
                         H_Q: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr,
                         ROT: tl.constexpr, PASS: tl.constexpr,
                         PAGE: tl.constexpr, HAS_NORM: tl.constexpr, FP32_ROPE: tl.constexpr,
                         KV_FP8: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    HALF: tl.constexpr = ROT // 2
    dtype = q_out_ptr.dtype.element_ty
    d = tl.arange(0, HALF)
    row = qkv_ptr + t * (H_Q + 2 * H_KV) * D
    x1 = tl.load(row + h * D + d).to(tl.float32)
    x2 = tl.load(row + h * D + HALF + d).to(tl.float32)
    p = tl.arange(0, PASS)
    p_mask = p < D - ROT
    if ROT < D:  # the pass-through dims of partial RoPE
        xp = tl.load(row + h * D + ROT + p, mask=p_mask, other=0.0).to(tl.float32)
    else:
        xp = x1  # unused
    c = tl.load(cos_ptr + t * HALF + d)
    s = tl.load(sin_ptr + t * HALF + d)
    if h < H_Q:
        if HAS_NORM:
            x1, x2, xp = _head_norm(x1, x2, xp, p_mask, qw_ptr, eps, HALF, D, ROT, PASS, dtype)
        _store_head(q_out_ptr + (t * H_Q + h) * D, x1, x2, xp, p_mask, c, s, 1.0, HALF, D,
                    ROT, PASS, FP32_ROPE, False, dtype)
    else:
        kvh = h - H_Q
        if HAS_NORM:
            x1, x2, xp = _head_norm(x1, x2, xp, p_mask, kw_ptr, eps, HALF, D, ROT, PASS, dtype)
        pos = tl.load(pos_ptr + t)
        page = tl.load(page_table_ptr + pos // PAGE).to(tl.int64)
        slot = ((page * PAGE + pos % PAGE) * H_KV + kvh) * D
        k_scale = tl.load(k_scale_ptr) if KV_FP8 else 1.0
        _store_head(k_cache_ptr + slot, x1, x2, xp, p_mask, c, s, k_scale, HALF, D, ROT, PASS,
                    FP32_ROPE, KV_FP8, dtype)
        v = row + (H_Q + H_KV + kvh) * D
        dd = tl.arange(0, D)
        if KV_FP8:
            v_codes = quantize_e4m3(tl.load(v + dd).to(tl.float32), tl.load(v_scale_ptr))
            tl.store(v_cache_ptr + slot + dd, v_codes)
        else:
            tl.store(v_cache_ptr + slot + dd, tl.load(v + dd))


def qk_norm_rope_write(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                       q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                       cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                       full_precision: bool, k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Normalise and rotate q and k, write k and v into one layer of the paged cache.

    Args:
        qkv: [N, (Hq + 2 Hkv) * D] contiguous (q heads, then k heads, then v heads).
        q_weight, k_weight: [D] per-head RMSNorm weights, or both None (no q/k norm).
        cos, sin: [N, R/2] fp32 contiguous at the tokens' positions (`RotaryEmbedding.cos_sin`):
            the first R dims of each head are rotated (R = D, or R < D: partial RoPE; R/2 a
            power of two, as D).
        positions: [N] int64 absolute positions (cache slots via `page_table`).
        k_cache, v_cache: [num_pages, page_size, Hkv, D] contiguous, qkv's dtype or
            float8_e4m3fn (an FP8 cache: k / k_scale and v / v_scale are stored, clamped to
            +-448 and rounded to nearest even, as `dlrt.ops.reference.quantize_kv`).
        full_precision: rotate in fp32 (LLaDA) instead of the dtype (Qwen3/SDAR).
        k_scale, v_scale: FP8 caches only: fp32 scalar tensors ([] or [1]) on the device.
    Returns:
        q: [N, Hq, D] in qkv.dtype.
    Raises:
        ValueError: a layout other than the above; an FP8 cache without its scales.
    """
    n = qkv.shape[0]
    if qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim or not qkv.is_contiguous():
        raise ValueError(f"qkv {tuple(qkv.shape)} is not a contiguous [N, (Hq + 2 Hkv) * D]")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q_weight and k_weight go together")
    half = cos.shape[-1]
    rot = 2 * half
    if rot > head_dim or half & (half - 1) or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"cos/sin {tuple(cos.shape)}: need contiguous [N, R/2] with R <= D="
                         f"{head_dim} and R/2 a power of two")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 != (v_cache.dtype == torch.float8_e4m3fn) or (not fp8 and k_cache.dtype != qkv.dtype):
        raise ValueError(f"caches {k_cache.dtype}, {v_cache.dtype}: both qkv's dtype "
                         f"({qkv.dtype}) or both float8_e4m3fn")
    if fp8:
        if k_scale is None or v_scale is None or k_scale.dtype != torch.float32 \
                or v_scale.dtype != torch.float32:
            raise ValueError("an FP8 KV cache is written with fp32 k_scale and v_scale")
        # NOTE: the kernel stores e4m3 codes it rounds itself, through byte views.
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    q = torch.empty((n, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    has_norm = q_weight is not None
    _qk_norm_rope_kernel[(n, num_heads + num_kv_heads)](
        qkv, q_weight if has_norm else qkv, k_weight if has_norm else qkv, cos, sin, positions,
        page_table, k_cache, v_cache, q, k_scale if fp8 else cos, v_scale if fp8 else cos, eps,
        H_Q=num_heads, H_KV=num_kv_heads, D=head_dim, ROT=rot,
        PASS=triton.next_power_of_2(max(head_dim - rot, 1)), PAGE=k_cache.shape[1],
        HAS_NORM=has_norm, FP32_ROPE=full_precision, KV_FP8=fp8, num_warps=1,
        enable_fp_fusion=False, **pdl.launch_options(qkv))
    return q
