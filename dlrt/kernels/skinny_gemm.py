"""Weight-streaming GEMM for a few rows: y[M, N] = x[M, K] @ w[N, K]^T with M <= 16.

A denoising round multiplies a block of 4-64 rows by every weight matrix once, so the product
is bound by reading the weights. Two kernels, configured per weight shape by timing against
cuBLAS (`dlrt.tuning.linear`):

- "dot": each program streams a [BLOCK_N, K / SPLIT_K] slab of `w` (software-pipelined by
  Triton) against x padded to 16 rows with tensor-core dots; with SPLIT_K > 1 the partial sums
  go to a scratch buffer and the last split of each output tile adds them in a fixed order
  (deterministic; `dlrt.kernels.split_k`).
- "fma" (M <= 4): a GEMV (`gemv`); each program owns BLOCK_N whole rows of `w`, keeps the
  next 1-4 [BLOCK_N, BLOCK_K] tiles in flight while it multiplies the current one into fp32
  accumulators (CUDA-core FMAs; runs of 8 adjacent products summed inside a thread), and
  reduces over K once at the end. No split-K, no second kernel. x is read in the weight
  tile's layout (no shared-memory round trip). Under programmatic dependent launch
  (`dlrt.kernels.pdl`) its first weight tiles are loaded before it waits for the kernel that
  produces x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl, split_k

MAX_ROWS = 16
FMA_ROWS = 4  # the "fma" kernel keeps one accumulator per row of x
VEC = 8  # the GEMV sums runs of VEC adjacent products inside a thread (16-byte bf16 loads)


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    split_k: int
    stages: int = 4
    warps: int = 4
    kind: str = "dot"  # "dot" (tensor cores, split-K) or "fma" (GEMV, M <= FMA_ROWS)
    # stages: Triton's pipeline depth for "dot"; weight tiles loaded ahead (1-4) for "fma"

    def fits(self, n: int, k: int) -> bool:
        """Whether the config serves w [n, k]: K a positive multiple of the K tile (times
        split_k), power-of-two tiles (Triton's aranges)."""
        pow2 = all(v > 0 and v & (v - 1) == 0 for v in (self.block_n, self.block_k))
        if not pow2 or k <= 0 or n <= 0:
            return False
        if self.kind == "fma":
            return (self.split_k == 1 and k % self.block_k == 0 and self.block_k % VEC == 0
                    and self.stages in (1, 2, 3, 4))
        return k % (self.split_k * self.block_k) == 0 and self.block_n <= max(16, n)

    def x_row(self) -> bool:
        """GEMV: every warp of the tile lies along K (32 threads of VEC bf16 each), so x is
        read once per column, not once per weight row."""
        return self.block_k % (32 * VEC * self.warps) == 0

    def max_rows(self) -> int:
        return FMA_ROWS if self.kind == "fma" else MAX_ROWS


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, FUSED: tl.constexpr, PRECISION: tl.constexpr,
                 PDL: tl.constexpr):
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
    split_k.store_tile(acc, y_ptr, part_ptr, count_ptr, m[:, None] * N + n[None, :],
                       m_ok[:, None] & n_ok[None, :], pid_n, pid_k, BLOCK_M * N, SPLIT_K, FUSED)


@triton.jit
def _x_load(x_ptr, m: tl.constexpr, t, k, z, K: tl.constexpr, BLOCK_K: tl.constexpr,
            TILES: tl.constexpr, X_ROW: tl.constexpr):
    """Tile t (clamped at the last) of input row m in the weight tile's layout, so the
    broadcast needs no shared-memory layout conversion: X_ROW: as [1, BLOCK_K] (the tile's
    warps all lie along K: each value loaded once); else as [BLOCK_N, BLOCK_K] with the same
    value down the rows (z: zeros [BLOCK_N])."""
    kt = tl.minimum(t, TILES - 1) * BLOCK_K + k
    if X_ROW:
        cols = kt[None, :]
    else:
        cols = kt[None, :] + z[:, None]
    return tl.load(x_ptr + m * K + cols)


@triton.jit
def _fma(acc, w, x, VEC: tl.constexpr):
    """acc [BLOCK_N, BLOCK_K // VEC] += w * x, summed over runs of VEC adjacent columns (each
    run lies in one thread: no shuffles, and 1/VEC of the accumulator registers)."""
    return acc + tl.sum(tl.reshape(w * x, [acc.shape[0], acc.shape[1], VEC]), axis=2)


@triton.jit
def _s_load(s_row, t, k, z, BLOCK_K: tl.constexpr, TILES: tl.constexpr, X_ROW: tl.constexpr):
    """The block scale (one per 128 columns, `dlrt.kernels.fp8_gemm`) of tile t (clamped at
    the last): one value when the tile lies in one scale block (BLOCK_K <= 128: one load),
    else that of every column in x's layout (`_x_load`): [1, BLOCK_K] or [BLOCK_N, BLOCK_K] (a
    load per element, from L1)."""
    if BLOCK_K <= 128:
        sv = tl.load(s_row + (tl.minimum(t, TILES - 1) * BLOCK_K) // 128)
    else:
        kb = (tl.minimum(t, TILES - 1) * BLOCK_K + k) // 128
        if X_ROW:
            sv = tl.load(s_row + kb[None, :])
        else:
            sv = tl.load(s_row + kb[None, :] + z[:, None])
    return sv


@triton.jit
def _row_step(acc, w, p, sv, x_ptr, m: tl.constexpr, t, k, z, K: tl.constexpr,
              BLOCK_K: tl.constexpr, TILES: tl.constexpr, X_ROW: tl.constexpr,
              VEC: tl.constexpr, SCALED: tl.constexpr):
    """Tile t of input row m: multiply its loaded tile p (SCALED: times its block scale sv,
    per column) into acc, and load tile t+1. Returns (acc, p)."""
    x = p.to(tl.float32)
    if SCALED:
        x = x * sv
    p = _x_load(x_ptr, m, t + 1, k, z, K, BLOCK_K, TILES, X_ROW)
    return _fma(acc, w, x, VEC), p


@triton.jit
def _store_row(acc, y_ptr, m: tl.constexpr, n, N):
    tl.store(y_ptr + m * N + n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n < N)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, N, K: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                 VEC: tl.constexpr, X_ROW: tl.constexpr, SCALED: tl.constexpr,
                 PDL: tl.constexpr):
    """y[m] = x[m] @ w^T for ROWS <= 4 rows; SCALED: w holds FP8 codes and s_ptr their
    float32 scales per 128 x 128 block (`dlrt.kernels.fp8_gemm`; BLOCK_N divides 128), each
    applied to x's column (x * s is exact in fp32 before the product: the dequantised weight's
    product); else s_ptr is unused."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = w_ptr + tl.minimum(n, N - 1).to(tl.int64)[:, None] * K  # clamped: no load masks
    KB: tl.constexpr = (K + 128 - 1) // 128
    s_row = s_ptr + ((tl.program_id(0) * BLOCK_N) // 128) * KB  # SCALED: BLOCK_N divides 128
    k = tl.arange(0, BLOCK_K)
    z = tl.zeros([BLOCK_N], tl.int32)
    TILES: tl.constexpr = K // BLOCK_K
    # weights (and their scales) only: these loads may run before the producer of x ends
    # (AHEAD tiles in flight)
    w0 = tl.load(rows + k[None, :])
    w1 = w0
    w2 = w0
    w3 = w0
    if AHEAD > 1:
        w1 = tl.load(rows + (tl.minimum(1, TILES - 1) * BLOCK_K + k)[None, :])
    if AHEAD > 2:
        w2 = tl.load(rows + (tl.minimum(2, TILES - 1) * BLOCK_K + k)[None, :])
    if AHEAD > 3:
        w3 = tl.load(rows + (tl.minimum(3, TILES - 1) * BLOCK_K + k)[None, :])
    sv = s_ptr  # unused unless SCALED
    if SCALED:
        sv = _s_load(s_row, 0, k, z, BLOCK_K, TILES, X_ROW)
    pdl.wait(PDL)
    a0 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    a1 = a0
    a2 = a0
    a3 = a0
    # the input's next tile is loaded one tile ahead too (it comes from L2, but a latency
    # per tile is what a program of a few tiles cannot hide)
    p0 = _x_load(x_ptr, 0, 0, k, z, K, BLOCK_K, TILES, X_ROW)
    p1 = p0
    p2 = p0
    p3 = p0
    if ROWS > 1:
        p1 = _x_load(x_ptr, 1, 0, k, z, K, BLOCK_K, TILES, X_ROW)
    if ROWS > 2:
        p2 = _x_load(x_ptr, 2, 0, k, z, K, BLOCK_K, TILES, X_ROW)
    if ROWS > 3:
        p3 = _x_load(x_ptr, 3, 0, k, z, K, BLOCK_K, TILES, X_ROW)
    for t in range(0, TILES):
        w = w0.to(tl.float32)
        nxt = rows + (tl.minimum(t + AHEAD, TILES - 1) * BLOCK_K + k)[None, :]
        if AHEAD == 1:  # keep AHEAD tiles in flight (clamped at the last tile)
            w0 = tl.load(nxt)
        elif AHEAD == 2:
            w0 = w1
            w1 = tl.load(nxt)
        elif AHEAD == 3:
            w0 = w1
            w1 = w2
            w2 = tl.load(nxt)
        else:
            w0 = w1
            w1 = w2
            w2 = w3
            w3 = tl.load(nxt)
        s = sv
        if SCALED:
            sv = _s_load(s_row, t + 1, k, z, BLOCK_K, TILES, X_ROW)
        a0, p0 = _row_step(a0, w, p0, s, x_ptr, 0, t, k, z, K, BLOCK_K, TILES, X_ROW, VEC,
                           SCALED)
        if ROWS > 1:
            a1, p1 = _row_step(a1, w, p1, s, x_ptr, 1, t, k, z, K, BLOCK_K, TILES, X_ROW, VEC,
                               SCALED)
        if ROWS > 2:
            a2, p2 = _row_step(a2, w, p2, s, x_ptr, 2, t, k, z, K, BLOCK_K, TILES, X_ROW, VEC,
                               SCALED)
        if ROWS > 3:
            a3, p3 = _row_step(a3, w, p3, s, x_ptr, 3, t, k, z, K, BLOCK_K, TILES, X_ROW, VEC,
                               SCALED)
    pdl.release(PDL)
    _store_row(a0, y_ptr, 0, n, N)
    if ROWS > 1:
        _store_row(a1, y_ptr, 1, n, N)
    if ROWS > 2:
        _store_row(a2, y_ptr, 2, n, N)
    if ROWS > 3:
        _store_row(a3, y_ptr, 3, n, N)


def gemv(x: torch.Tensor, w: torch.Tensor, config: GemmConfig) -> torch.Tensor:
    """The GEMV ("fma" config): y = x @ w^T.

    Args:
        x: [M <= 4, K] contiguous. w: [N, K] contiguous, x's dtype and device.
    Returns:
        y: [M, N] in x.dtype, a new tensor (fp32 sums).
    Raises:
        ValueError: x or w of the wrong shape, strides, dtype or device, or a config that
            does not fit w.
    """
    if config.kind != "fma":
        raise ValueError(f"gemv needs an 'fma' config, got {config}")
    bad = x.dim() != 2 or w.dim() != 2 or not (x.is_contiguous() and w.is_contiguous())
    n, k = w.shape if w.dim() == 2 else (0, 0)
    if bad or x.shape[1] != k or x.shape[0] > FMA_ROWS:
        raise ValueError(f"gemv: x {tuple(x.shape)} and w {tuple(w.shape)} must be contiguous "
                         f"[M<={FMA_ROWS}, K] and [N, K]")
    m = x.shape[0]
    if not config.fits(n, k):
        raise ValueError(f"gemv: {config} does not fit N={n}, K={k}")
    if w.dtype != x.dtype or w.device != x.device:
        raise ValueError(f"gemv: w is {w.dtype} on {w.device}, x is {x.dtype} on {x.device}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:  # the kernel always computes row 0
        return y
    launch_gemv(x, w, None, y, config)
    return y


def launch_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
                y: torch.Tensor, config, vec: int = VEC) -> None:
    """y = x @ w^T by the GEMV kernel (an "fma" config: block_n, block_k, stages, warps,
    x_row(); shapes checked by the caller; vec: products summed in a thread, a 16-byte
    weight load); `scale`: the FP8 weight's float32 128 x 128 block scales, else None."""
    n, k = w.shape
    _gemv_kernel[(triton.cdiv(n, config.block_n),)](
        x, w, w if scale is None else scale, y, n, K=k, ROWS=x.shape[0],
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, AHEAD=config.stages, VEC=vec,
        X_ROW=config.x_row(), SCALED=scale is not None, num_warps=config.warps, num_stages=1,
        **pdl.launch_options(x))


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, config: GemmConfig) -> torch.Tensor:
    """x: [M, K], w: [N, K], both contiguous, same float dtype -> [M, N] in x.dtype.

    M <= 16 for "dot" configs, M <= 4 for "fma" configs (`gemv`). fp32 inputs multiply in full
    fp32 (no TF32). Raises ValueError on shapes the config does not fit (K must be a multiple
    of split_k * block_k).
    """
    rows = config.max_rows()
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} and w {tuple(w.shape)} must be "
                         f"[M<={rows}, K] and [N, K]")
    m, k = x.shape
    n = w.shape[0]
    if m > rows or w.shape[1] != k or not (x.is_contiguous() and w.is_contiguous()):
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} and w {tuple(w.shape)} must be "
                         f"contiguous [M<={rows}, K] and [N, K]")
    if not config.fits(n, k):
        raise ValueError(f"skinny_gemm: {config} does not fit N={n}, K={k}")
    if config.kind == "fma":
        return gemv(x, w, config)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    opts = pdl.launch_options(x)
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    part, count, fused = split_k.partials(y, config.split_k, MAX_ROWS, grid[0])
    _gemm_kernel[grid](x, w, y, part, count, m, n, K=k, BLOCK_M=MAX_ROWS,
                       BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=config.split_k,
                       FUSED=fused, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                       num_stages=config.stages, num_warps=config.warps, **opts)
    return split_k.finish(part, y, config.split_k, MAX_ROWS, fused, opts)
