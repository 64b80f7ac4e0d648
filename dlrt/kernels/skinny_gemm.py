"""Weight-streaming GEMM for a few rows: y[M, N] = x[M, K] @ w[N, K]^T with M <= 16.

A denoising round multiplies a block of 4-64 rows by every weight matrix once, so the product
is bound by reading the weights. Two kernels, configured per weight shape by timing against
cuBLAS (`dlrt.kernels.gemm_select`):

- "dot": each program streams a [BLOCK_N, K / SPLIT_K] slab of `w` (software-pipelined by
  Triton) against x padded to 16 rows with tensor-core dots; with SPLIT_K > 1 the partial sums
  go to a scratch buffer and a second kernel adds them in a fixed order (deterministic).
- "fma" (M <= 4): a GEMV; each program owns BLOCK_N whole rows of `w`, keeps the next one or
  two [BLOCK_N, BLOCK_K] tiles in flight while it multiplies the current one into one fp32
  accumulator per row of x (CUDA-core FMAs), and reduces over K once at the end. No split-K,
  no second kernel. Under programmatic dependent launch (`dlrt.kernels.pdl`) its first weight
  tiles are loaded before it waits for the kernel that produces x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl

MAX_ROWS = 16
FMA_ROWS = 4  # the "fma" kernel keeps one accumulator per row of x


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    split_k: int
    stages: int = 4
    warps: int = 4
    kind: str = "dot"  # "dot" (tensor cores, split-K) or "fma" (GEMV, M <= FMA_ROWS)
    # stages: Triton's pipeline depth for "dot"; weight tiles loaded ahead (1 or 2) for "fma"

    def fits(self, n: int, k: int) -> bool:
        if self.kind == "fma":
            return self.split_k == 1 and k % self.block_k == 0 and self.stages in (1, 2)
        return k % (self.split_k * self.block_k) == 0 and self.block_n <= max(16, n)

    def max_rows(self) -> int:
        return FMA_ROWS if self.kind == "fma" else MAX_ROWS


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, part_ptr, M, N, K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    K_SPLIT: tl.constexpr = K // SPLIT_K
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


@triton.jit
def _fma_row(acc, w, x_ptr, m: tl.constexpr, k, K: tl.constexpr):
    x = tl.load(x_ptr + m * K + k).to(tl.float32)
    return acc + w * x[None, :]


@triton.jit
def _store_row(acc, y_ptr, m: tl.constexpr, n, N):
    tl.store(y_ptr + m * N + n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n < N)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                 PDL: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = w_ptr + tl.minimum(n, N - 1).to(tl.int64)[:, None] * K  # clamped: no load masks
    k = tl.arange(0, BLOCK_K)
    TILES: tl.constexpr = K // BLOCK_K
    # weights only: these loads may run before the producer of x ends
    w_next = tl.load(rows + k[None, :])
    w_after = w_next
    if AHEAD > 1:
        w_after = tl.load(rows + (tl.minimum(1, TILES - 1) * BLOCK_K + k)[None, :])
    pdl.wait(PDL)
    a0 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    a1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    a2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    a3 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for t in range(0, TILES):
        w = w_next.to(tl.float32)
        kt = t * BLOCK_K + k
        # AHEAD tiles in flight while this one is multiplied (clamped at the last tile)
        if AHEAD > 1:
            w_next = w_after
            w_after = tl.load(rows + (tl.minimum(t + 2, TILES - 1) * BLOCK_K + k)[None, :])
        else:
            w_next = tl.load(rows + (tl.minimum(t + 1, TILES - 1) * BLOCK_K + k)[None, :])
        a0 = _fma_row(a0, w, x_ptr, 0, kt, K)
        if ROWS > 1:
            a1 = _fma_row(a1, w, x_ptr, 1, kt, K)
        if ROWS > 2:
            a2 = _fma_row(a2, w, x_ptr, 2, kt, K)
        if ROWS > 3:
            a3 = _fma_row(a3, w, x_ptr, 3, kt, K)
    pdl.release(PDL)
    _store_row(a0, y_ptr, 0, n, N)
    if ROWS > 1:
        _store_row(a1, y_ptr, 1, n, N)
    if ROWS > 2:
        _store_row(a2, y_ptr, 2, n, N)
    if ROWS > 3:
        _store_row(a3, y_ptr, 3, n, N)


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, config: GemmConfig) -> torch.Tensor:
    """x: [M, K], w: [N, K], both contiguous, same float dtype -> [M, N] in x.dtype.

    M <= 16 for "dot" configs, M <= 4 for "fma" configs. fp32 inputs multiply in full fp32 (no
    TF32). Raises ValueError on shapes the config does not fit (K must be a multiple of
    split_k * block_k).
    """
    m, k = x.shape
    n = w.shape[0]
    rows = config.max_rows()
    if m > rows or w.shape[1] != k or not (x.is_contiguous() and w.is_contiguous()):
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} and w {tuple(w.shape)} must be "
                         f"contiguous [M<={rows}, K] and [N, K]")
    if not config.fits(n, k):
        raise ValueError(f"skinny_gemm: {config} does not fit N={n}, K={k}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:  # the GEMV always computes row 0
        return y
    opts = pdl.launch_options(x)
    if config.kind == "fma":
        _gemv_kernel[(triton.cdiv(n, config.block_n),)](
            x, w, y, n, K=k, ROWS=m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            AHEAD=config.stages, num_warps=config.warps, num_stages=1, **opts)
        return y
    part = y
    if config.split_k > 1:
        part = torch.empty((config.split_k, MAX_ROWS, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    _gemm_kernel[grid](x, w, y, part, m, n, K=k, BLOCK_M=MAX_ROWS, BLOCK_N=config.block_n,
                       BLOCK_K=config.block_k, SPLIT_K=config.split_k,
                       PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                       num_stages=config.stages, num_warps=config.warps, **opts)
    if config.split_k > 1:
        block = 1024
        _reduce_kernel[(triton.cdiv(m * n, block),)](part, y, m, n, SPLIT_K=config.split_k,
                                                     BLOCK_M=MAX_ROWS, BLOCK=block, **opts)
    return y
