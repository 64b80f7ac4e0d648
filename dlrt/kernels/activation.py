"""SiLU-and-mul over a fused gate-up projection: [N, 2I] -> [N, I]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    dtype = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * 2 * inter + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * inter + inter + offs, mask=ok, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # silu, rounded like F.silu
    tl.store(out_ptr + row * inter + offs, (act * u).to(dtype), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up where gate_up = [gate | up]: [N, 2I] contiguous -> [N, I] same dtype.

    Each product is rounded like `F.silu(g) * u` in the input dtype (silu in fp32, then cast).
    """
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or not gate_up.is_contiguous():
        raise ValueError(f"silu_mul expects a contiguous [N, 2I] tensor, got "
                         f"{tuple(gate_up.shape)}")
    n, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty((n, i), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(n, triton.cdiv(i, block))](gate_up, out, i, BLOCK=block, num_warps=4,
                                                  **pdl.launch_options(gate_up))
    return out
