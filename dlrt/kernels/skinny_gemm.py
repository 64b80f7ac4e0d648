"""Weight-streaming GEMM for a few rows: y[M, N] = x[M, K] @ w[N, K]^T with M <= 16.

A denoising round multiplies a block of 4-64 rows by every weight matrix once, so the product
is bound by reading the weights. Each program streams a [BLOCK_N, K / SPLIT_K] slab of `w`
(rows contiguous along K, software-pipelined by Triton) against the padded rows of x; with
SPLIT_K > 1 the partial sums go to a scratch buffer and a second kernel adds them in a fixed
order, so results are deterministic (no atomics). Under programmatic dependent launch
(`dlrt.kernels.pdl`) each program prefetches the start of its slab into the L2 cache before it
waits for the kernel that produces x, so the weight stream starts during that kernel's tail.
Configurations are chosen per weight shape
by timing against cuBLAS (`dlrt.kernels.gemm_select`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt import env
from dlrt.kernels import pdl

MAX_ROWS = 16


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    split_k: int
    stages: int = 4
    warps: int = 4

    def fits(self, n: int, k: int) -> bool:
        return k % (self.split_k * self.block_k) == 0 and self.block_n <= max(16, n)


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, part_ptr, M, N, K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, PRECISION: tl.constexpr, PREFETCH: tl.constexpr,
                 PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    K_SPLIT: tl.constexpr = K // SPLIT_K
    if PDL:
        if PREFETCH > 0:  # bytes of each of this program's weight rows, from its K range
            rows = tl.minimum(n, N - 1).to(tl.int64) * K + pid_k * K_SPLIT
            pdl.prefetch_l2(w_ptr + rows, tl.full([BLOCK_N], PREFETCH, tl.int32))
    pdl.wait(PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for t in range(0, K_SPLIT // BLOCK_K):
        k = pid_k * K_SPLIT + t * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :], mask=n_ok[:, None],
                    other=0.0)
        x = tl.load(x_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None], other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    pdl.release(PDL)
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + m[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(part_ptr + (pid_k * BLOCK_M + m[:, None]) * N + n[None, :], acc, mask=ok)


@triton.jit
def _reduce_kernel(part_ptr, y_ptr, M, N, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # flat (m, n) of y
    ok = i < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, SPLIT_K):  # fixed order: deterministic
        acc += tl.load(part_ptr + s * BLOCK_M * N + i, mask=ok, other=0.0)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=ok)


def prefetch_bytes(n: int, k: int, elem: int, config: GemmConfig) -> int:
    """Bytes of each weight row's K range that a program prefetches into L2 before its wait:
    the whole range when the weight is within DLRT_GEMM_PREFETCH_MB, else a share of that
    budget; a multiple of 16, 0 when nothing is prefetched."""
    row = k // config.split_k * elem
    budget = env.gemm_prefetch_mb() * (1 << 20) / (n * config.split_k)
    return int(min(row, budget)) // 16 * 16


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, config: GemmConfig) -> torch.Tensor:
    """x: [M, K] (M <= 16), w: [N, K], both contiguous, same float dtype -> [M, N] in x.dtype.

    fp32 inputs multiply in full fp32 (no TF32). Raises ValueError on shapes the config does
    not fit (K must be a multiple of split_k * block_k).
    """
    m, k = x.shape
    n = w.shape[0]
    if m > MAX_ROWS or w.shape[1] != k or not (x.is_contiguous() and w.is_contiguous()):
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} and w {tuple(w.shape)} must be "
                         f"contiguous [M<={MAX_ROWS}, K] and [N, K]")
    if not config.fits(n, k):
        raise ValueError(f"skinny_gemm: {config} does not fit N={n}, K={k}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    part = y
    if config.split_k > 1:
        part = torch.empty((config.split_k, MAX_ROWS, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    opts = pdl.launch_options(x)
    prefetch = 0
    if opts["PDL"] and w.data_ptr() % 16 == 0:
        prefetch = prefetch_bytes(n, k, w.element_size(), config)
    _gemm_kernel[grid](x, w, y, part, m, n, K=k, BLOCK_M=MAX_ROWS, BLOCK_N=config.block_n,
                       BLOCK_K=config.block_k, SPLIT_K=config.split_k,
                       PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                       PREFETCH=prefetch, num_stages=config.stages, num_warps=config.warps,
                       **opts)
    if config.split_k > 1:
        block = 1024
        _reduce_kernel[(triton.cdiv(m * n, block),)](part, y, m, n, SPLIT_K=config.split_k,
                                                     BLOCK_M=MAX_ROWS, BLOCK=block, **opts)
    return y
