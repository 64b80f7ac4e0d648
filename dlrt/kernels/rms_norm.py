"""RMSNorm with an optional fused residual add, one program per row.

Numerics follow `dlrt.layers.norm.RMSNorm` (transformers' Qwen3RMSNorm, OLMo's RMSLayerNorm):
the residual sum is rounded to the input dtype (as `x + residual` would be), statistics are
taken in fp32, the normalised row is cast to the input dtype before the weight multiply.

`rms_norm_fp8` is the same kernel writing, instead of the output row, its W8A8 quantisation
(`dlrt.kernels.fp8_gemm.quantize_x`: e4m3 codes and one fp32 scale per 128-column group), the
input of an FP8 W8A8 GEMM, so no separate quantisation kernel runs after the norm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl
from dlrt.kernels.e4m3 import QGROUP, store_fp8_groups


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, s_ptr, H, eps, HAS_RES: tl.constexpr,
                     QUANT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Row pid 0. QUANT: y_ptr is the uint8 view of the e4m3 codes [N, H] and s_ptr the scales
    [N, ceil(H / 128)] (BLOCK >= 128); otherwise y_ptr is the output [N, H] (s_ptr unused)."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * H + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * H + offs, mask=ok, other=0.0).to(tl.float32)
        s = (x + r).to(dtype)
        tl.store(res_ptr + row * H + offs, s, mask=ok)
        x = s.to(tl.float32)
    var = tl.sum(x * x, axis=0) / H
    h = (x * tl.math.rsqrt(var + eps)).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = (w * h).to(dtype)
    if QUANT:  # padding columns are 0 (w is 0 there)
        store_fp8_groups(y.to(tl.float32), y_ptr, s_ptr, row, 0, H)
    else:
        tl.store(y_ptr + row * H + offs, y, mask=ok)


def _check(x: torch.Tensor, residual: torch.Tensor | None, name: str) -> None:
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"{name} expects a contiguous [N, H] tensor, got {tuple(x.shape)}")
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")


def _launch(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
            out: torch.Tensor, scale: torch.Tensor | None) -> None:
    """scale None: out is y; else out is the uint8 view of the codes and scale the scales."""
    n, h = x.shape
    # at least one 128-column group wide: the same tile (and fp32 sum) with and without QUANT
    block = max(QGROUP, triton.next_power_of_2(h))
    if n:
        _rms_norm_kernel[(n,)](x, residual if residual is not None else x, weight, out,
                               scale if scale is not None else out, h, eps,
                               HAS_RES=residual is not None, QUANT=scale is not None,
                               BLOCK=block, num_warps=min(16, max(1, block // 256)),
                               **pdl.launch_options(x))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = weight * norm(x + residual) over the last dim.

    Args:
        x: [N, H] contiguous, any float dtype; weight: [H] same dtype.
        residual: optional [N, H] like x; updated IN PLACE to x + residual (rounded to the
            dtype), which is the input of the norm.
    Returns:
        y: [N, H] in x.dtype (a new tensor).
    Raises:
        ValueError: x not a contiguous 2-D tensor, or residual not a contiguous tensor of x's
            shape.
    """
    _check(x, residual, "rms_norm")
    y = torch.empty_like(x)
    _launch(x, weight, eps, residual, y, None)
    return y


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`rms_norm` quantised for an FP8 W8A8 GEMM in the same kernel: (q, scale).

    Args: as `rms_norm` (x: [N, H] contiguous, bf16 / fp16 / fp32, any H including H < 128 and
        H not a multiple of 128; weight: [H] same dtype; residual: optional [N, H] like x,
        updated IN PLACE to x + residual rounded to the dtype, as `rms_norm` does).
    Returns:
        q: float8_e4m3fn [N, H], the codes; scale: float32 [N, ceil(H / 128)], one per row and
        128-column group (the last group may be partial). With y = rms_norm(x, weight, eps,
        residual) (y rounded to x.dtype as that function returns it): s = amax(|y_group|) /
        448 (IEEE division; 1.0 for an all-zero group) and q = e4m3(clamp(y / s, -448, 448)),
        round to nearest even. Bit for bit `dlrt.kernels.fp8_gemm.quantize_x(y)`, and
        q * s per group (in fp32, cast to x.dtype) is `dlrt.layers.quant.fp8
        .quantize_activations(y)`.
    Raises:
        ValueError: as `rms_norm`.
    """
    _check(x, residual, "rms_norm_fp8")
    n, h = x.shape
    q = torch.empty((n, h), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((n, triton.cdiv(h, QGROUP)), dtype=torch.float32, device=x.device)
    _launch(x, weight, eps, residual, q.view(torch.uint8), scale)
    return q, scale
