"""RMSNorm with an optional fused residual add, one program per row.

Numerics follow `dlrt.layers.norm.RMSNorm` (transformers' Qwen3RMSNorm, OLMo's RMSLayerNorm):
the residual sum is rounded to the input dtype (as `x + residual` would be), statistics are
taken in fp32, the normalised row is cast to the input dtype before the weight multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, H, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    dtype = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * H + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * H + offs, mask=ok, other=0.0).to(tl.float32)
        s = (x + r).to(dtype)
        tl.store(res_ptr + row * H + offs, s, mask=ok)
        x = s.to(tl.float32)
    var = tl.sum(x * x, axis=0) / H
    h = (x * tl.math.rsqrt(var + eps)).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + offs, (w * h).to(dtype), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = weight * norm(x + residual) over the last dim.

    Args:
        x: [N, H] contiguous, any float dtype; weight: [H] same dtype.
        residual: optional [N, H] like x; updated IN PLACE to x + residual (rounded to the
            dtype), which is the input of the norm.
    Returns:
        y: [N, H] in x.dtype (a new tensor).
    """
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"rms_norm expects a contiguous [N, H] tensor, got {tuple(x.shape)}")
    n, h = x.shape
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    y = torch.empty_like(x)
    block = triton.next_power_of_2(h)
    _rms_norm_kernel[(n,)](x, residual if residual is not None else x, weight, y, h, eps,
                           HAS_RES=residual is not None, BLOCK=block,
                           num_warps=min(16, max(1, block // 256)), **pdl.launch_options(x))
    return y
