"""SiLU-and-mul over a fused gate-up projection: [N, 2I] -> [N, I]; `gate_act`, the gate
activations the fused MoE kernels apply (`dlrt.kernels.moe`).

`silu_mul_fp8` is the same kernel writing, instead of the product, its W8A8 quantisation
(`dlrt.kernels.fp8_gemm.quantize_x`: e4m3 codes and one fp32 scale per 128-column group), the
input of an FP8 W8A8 down projection, so no separate quantisation kernel runs after it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl
from dlrt.kernels.e4m3 import QGROUP, store_fp8_groups

# the gate activations of `gate_act` (config.json's `hidden_act` / `hidden_activation` names)
GATE_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)


@triton.jit
def gate_act(g, ACTIVATION: tl.constexpr):
    """act(g) of fp32 g, in fp32, `ACTIVATION` one of GATE_ACTIVATIONS: "silu" g / (1 + e^-g);
    "gelu_pytorch_tanh" (transformers' name for F.gelu(g, approximate="tanh")):
    0.5 g (1 + tanh(y)), y = sqrt(2 / pi) (g + 0.044715 g^3), computed as g / (1 + e^(-2y))
    (the same value; within a few fp32 ulps of PyTorch's tanh form)."""
    if ACTIVATION == "silu":
        return g / (1.0 + tl.exp(-g))
    else:
        y = SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        return g / (1.0 + tl.exp(-2.0 * y))


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, s_ptr, inter, QUANT: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    """Row pid 0, columns pid 1 * BLOCK ... QUANT: out_ptr is the uint8 view of the e4m3 codes
    [N, I] and s_ptr the scales [N, ceil(I / 128)] (BLOCK a multiple of 128); otherwise
    out_ptr is the product [N, I] (s_ptr unused)."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    ok = offs < inter
    dtype = gu_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * 2 * inter + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * inter + inter + offs, mask=ok, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # silu, rounded like F.silu
    y = (act * u).to(dtype)
    if QUANT:  # padding columns are 0 (g and u are 0 there)
        store_fp8_groups(y.to(tl.float32), out_ptr, s_ptr, row, start, inter)
    else:
        tl.store(out_ptr + row * inter + offs, y, mask=ok)


def _check(gate_up: torch.Tensor, name: str) -> tuple[int, int]:
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or not gate_up.is_contiguous():
        raise ValueError(f"{name} expects a contiguous [N, 2I] tensor, got "
                         f"{tuple(gate_up.shape)}")
    return gate_up.shape[0], gate_up.shape[1] // 2


def _launch(gate_up: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None) -> None:
    """scale None: out is the product; else the uint8 view of the codes and scale the scales."""
    n, i = out.shape
    block = 1024  # a multiple of 128: a program owns whole groups
    if n and i:
        _silu_mul_kernel[(n, triton.cdiv(i, block))](
            gate_up, out, scale if scale is not None else out, i, QUANT=scale is not None,
            BLOCK=block, num_warps=4, **pdl.launch_options(gate_up))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up where gate_up = [gate | up]: [N, 2I] contiguous -> [N, I] same dtype.

    Each product is rounded like `F.silu(g) * u` in the input dtype (silu in fp32, then cast).
    Raises ValueError unless gate_up is a contiguous 2-D tensor with an even number of columns.
    """
    n, i = _check(gate_up, "silu_mul")
    out = torch.empty((n, i), dtype=gate_up.dtype, device=gate_up.device)
    _launch(gate_up, out, None)
    return out


def silu_mul_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`silu_mul` quantised for an FP8 W8A8 GEMM in the same kernel: (q, scale).

    gate_up: [N, 2I] contiguous (gate | up), bf16 / fp16 / fp32; any I, including I < 128
    and I not a multiple of 128.
    Returns q: float8_e4m3fn [N, I], the codes, and scale: float32 [N, ceil(I / 128)], one per
    row and 128-column group (the last group may be partial). With y = silu_mul(gate_up) (each
    product rounded to the dtype as that function returns it): s = amax(|y_group|) / 448 (IEEE
    division; 1.0 for an all-zero group) and q = e4m3(clamp(y / s, -448, 448)), round to
    nearest even. Bit for bit `dlrt.kernels.fp8_gemm.quantize_x(y)`, and q * s per group (in
    fp32, cast to the dtype) is `dlrt.layers.quant.fp8.quantize_activations(y)`.
    Raises ValueError as `silu_mul`.
    """
    n, i = _check(gate_up, "silu_mul_fp8")
    q = torch.empty((n, i), dtype=torch.float8_e4m3fn, device=gate_up.device)
    scale = torch.empty((n, triton.cdiv(i, QGROUP)), dtype=torch.float32, device=gate_up.device)
    _launch(gate_up, q.view(torch.uint8), scale)
    return q, scale
