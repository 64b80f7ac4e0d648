"""The second half of a dense layer as one persistent kernel (CUDA, <= 4 rows).

From the attention output to the layer's output, the classic layer runs seven kernels
(o_proj, add+RMSNorm, gate-up, SiLU-and-mul, down, and the next add); `dlrt.layers.gemv_layer`
folds the small ops into three GEMVs. Each kernel boundary still costs a ramp and a drain of
the memory pipeline, a few microseconds that at 4 rows are comparable to streaming a weight.
Here one launch of GRID programs (all resident at once) runs the three projections as stages
separated by grid-wide barriers:

    stage 1:  s1  = attn @ W_o^T + s0                     (residual add in the epilogue)
    stage 2:  gu  = rms_norm(s1, g, eps) @ W_gate_up^T    (norm in the prologue)
    stage 3:  out = (silu(gate) * up) @ W_down^T + s1     (SiLU-and-mul in the prologue)

Within a stage, program p owns the weight tiles p, p + GRID, ... ([BLOCK_N rows, K]; a stage
with fewer tiles than programs takes smaller ones). It streams each tile through Triton's
software pipeline (`stages` [BLOCK_N, BLOCK_K] tiles in flight) into a tensor-core dot with
the input padded to 16 rows, as `skinny_gemm`'s "dot" kernel does; the input is transformed
on the way in (`skinny_gemm._x_value`: the RMSNorm or SiLU-and-mul, rounded where the unfused
kernels round) and the residual added on the way out, rounded as `x + residual`. Each output
is summed by one program in a fixed order: results are deterministic.

The barrier is the cooperative-groups grid sync (one int32 counter: program 0 adds
2^31 - (GRID - 1), the others 1, so the counter's top bit flips when the last arrives and the
counter needs no reset). It needs every program resident at once: `layer_mlp` checks the
kernel's occupancy with the driver before the first launch of a configuration. The kernel lets
its dependent launch (`dlrt.kernels.pdl`) only after its last barrier, and waits for its
predecessor before its first, so a programmatic launch cannot interleave two grids' barriers.

Under TRITON_INTERPRET=1 (programs run one after another, a spin barrier would never end) the
stages are separate launches of the same kernel; `staged=True` does the same on the GPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl
from dlrt.kernels.skinny_gemm import FMA_ROWS, _x_value

TOP_BIT = 1 << 31


@dataclass(frozen=True)
class StreamConfig:
    """Tiles of the persistent layer kernel: weight tiles of up to `block_n` rows (a stage
    with fewer tiles than programs takes smaller ones, down to 16) by `block_k` columns,
    `stages` (1-4) weight tiles in flight, `warps` per program, `per_sm` programs per
    multiprocessor."""

    block_n: int = 32
    block_k: int = 256
    stages: int = 2
    warps: int = 4
    per_sm: int = 1

    def fits(self, *ks: int) -> bool:
        """Power-of-two tiles (block_n >= 16 for the tensor-core dot), block_k dividing every
        K in `ks`."""
        pow2 = all(v > 0 and v & (v - 1) == 0 for v in (self.block_n, self.block_k))
        return (pow2 and self.block_n >= 16 and self.block_k >= 16 and 1 <= self.stages <= 4
                and self.per_sm >= 1 and all(k > 0 and k % self.block_k == 0 for k in ks))

    def stage_block_n(self, n: int, grid: int) -> int:
        """The tile height for a stage of n weight rows: halved from block_n (not below 16)
        while the stage has fewer tiles than programs."""
        b = self.block_n
        while b > 16 and -(-n // b) < grid:
            b //= 2
        return b


@triton.jit
def _grid_sync(bar_ptr, GRID: tl.constexpr):
    """Arrive at and wait for the grid barrier (release the stage's stores, acquire the other
    programs')."""
    inc = tl.where(tl.program_id(0) == 0, 2147483649 - GRID, 1)  # 2^31 - (GRID - 1) or 1
    old = tl.atomic_add(bar_ptr, inc, sem="acq_rel", scope="gpu")
    cur = old
    while (cur ^ old) >= 0:  # the top bit has not flipped yet
        cur = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _w_tile(w_ptr, i, pid, nn, k, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, TILES: tl.constexpr, GRID: tl.constexpr,
            LAST: tl.constexpr):
    """The weight tile of a program's step i (clamped at its last step): rows of tile
    pid + (i // TILES) * GRID (clamped below N: a program without that tile rereads the last
    row), columns of K tile i % TILES."""
    i = tl.minimum(i, LAST)
    n = tl.minimum((pid + (i // TILES) * GRID) * BLOCK_N + nn, N - 1)
    return tl.load(w_ptr + n.to(tl.int64)[:, None] * K + ((i % TILES) * BLOCK_K + k)[None, :])


@triton.jit
def _x_tile(x_ptr, t, m, m_ok, k, K: tl.constexpr, BLOCK_K: tl.constexpr, SILU: tl.constexpr):
    """Raw K tile t of the input padded to 16 rows: (x, x), or (gate, up) for SILU."""
    XW: tl.constexpr = 2 * K if SILU else K  # the row stride of x
    ptr = x_ptr + m[:, None] * XW + (t * BLOCK_K + k)[None, :]
    a = tl.load(ptr, mask=m_ok[:, None], other=0.0)
    b = a
    if SILU:
        b = tl.load(ptr + K, mask=m_ok[:, None], other=0.0)
    return a, b


@triton.jit
def _stage(x_ptr, w_ptr, y_ptr, g_ptr, res_ptr, bar_ptr, eps, N: tl.constexpr,
           K: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           AHEAD: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr, RES: tl.constexpr,
           GRID: tl.constexpr, SYNC: tl.constexpr, PDL: tl.constexpr, RELEASE: tl.constexpr,
           PRECISION: tl.constexpr):
    """y[:, tiles of this program] = prologue(x) @ w^T (+ res), x [ROWS, K] (SILU: [ROWS, 2K]
    = [gate | up]) padded to 16 rows for the tensor-core dot. The program's tiles are one
    stream of [BLOCK_N, BLOCK_K] weight tiles, AHEAD in flight, the first loaded before the
    wait: SYNC, the grid barrier; else, with PDL, the predecessor."""
    pid = tl.program_id(0)
    TILES: tl.constexpr = K // BLOCK_K
    NT: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    # tiles x K tiles of the busiest program; the others rerun a clamped tile, stores masked
    STEPS: tl.constexpr = ((NT + GRID - 1) // GRID) * TILES
    m = tl.arange(0, 16)
    m_ok = m < ROWS
    nn = tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    w0 = _w_tile(w_ptr, 0, pid, nn, k, N, K, BLOCK_N, BLOCK_K, TILES, GRID, STEPS - 1)
    w1 = w0
    w2 = w0
    w3 = w0
    if AHEAD > 1:
        w1 = _w_tile(w_ptr, 1, pid, nn, k, N, K, BLOCK_N, BLOCK_K, TILES, GRID, STEPS - 1)
    if AHEAD > 2:
        w2 = _w_tile(w_ptr, 2, pid, nn, k, N, K, BLOCK_N, BLOCK_K, TILES, GRID, STEPS - 1)
    if AHEAD > 3:
        w3 = _w_tile(w_ptr, 3, pid, nn, k, N, K, BLOCK_N, BLOCK_K, TILES, GRID, STEPS - 1)
    if SYNC:
        _grid_sync(bar_ptr, GRID)
    else:
        pdl.wait(PDL)
    pdl.release(RELEASE)
    rstd = tl.full([16], 1.0, tl.float32)
    if NORM:  # the rows' RMS statistics, as `dlrt.kernels.rms_norm` computes them
        sq = tl.zeros([16], tl.float32)
        for t in range(0, TILES):
            v, _ = _x_tile(x_ptr, t, m, m_ok, k, K, BLOCK_K, False)
            v = v.to(tl.float32)
            sq += tl.sum(v * v, axis=1)
        rstd = tl.math.rsqrt(sq / K + eps)
    xa, xb = _x_tile(x_ptr, 0, m, m_ok, k, K, BLOCK_K, SILU)
    g_next = tl.load(g_ptr + k) if NORM else 1.0
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for i in range(0, STEPS):
        t = i % TILES
        t1 = (i + 1) % TILES
        w = w0
        nxt = _w_tile(w_ptr, i + AHEAD, pid, nn, k, N, K, BLOCK_N, BLOCK_K, TILES, GRID,
                      STEPS - 1)
        if AHEAD == 1:
            w0 = nxt
        elif AHEAD == 2:
            w0 = w1
            w1 = nxt
        elif AHEAD == 3:
            w0 = w1
            w1 = w2
            w2 = nxt
        else:
            w0 = w1
            w1 = w2
            w2 = w3
            w3 = nxt
        a = xa
        b = xb
        xa, xb = _x_tile(x_ptr, t1, m, m_ok, k, K, BLOCK_K, SILU)
        g = g_next
        if NORM:
            g_next = tl.load(g_ptr + t1 * BLOCK_K + k)
            x = _x_value(a, a, g.to(tl.float32)[None, :], rstd[:, None], True, False)
        elif SILU:
            x = _x_value(a, b, 1.0, 1.0, False, True)
        else:
            x = a
        acc += tl.dot(x.to(w.dtype), tl.trans(w), input_precision=PRECISION)
        if t == TILES - 1:  # the tile is summed: its epilogue, then the next tile
            n = (pid + (i // TILES) * GRID) * BLOCK_N + nn
            ok = m_ok[:, None] & (n < N)[None, :]
            y = acc.to(y_ptr.dtype.element_ty)
            if RES:  # the residual add, rounded as `x + residual`
                res = tl.load(res_ptr + m[:, None] * N + n[None, :], mask=ok, other=0.0)
                y = (y.to(tl.float32) + res.to(tl.float32)).to(y_ptr.dtype.element_ty)
            tl.store(y_ptr + m[:, None] * N + n[None, :], y, mask=ok)
            acc = tl.zeros([16, BLOCK_N], tl.float32)


@triton.jit
def _layer_mlp_kernel(a_ptr, s0_ptr, wo_ptr, g_ptr, wgu_ptr, wd_ptr, s1_ptr, gu_ptr, out_ptr,
                      bar_ptr, eps, H: tl.constexpr, A: tl.constexpr, INTER: tl.constexpr,
                      ROWS: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
                      BN_D: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                      GRID: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr,
                      SYNC: tl.constexpr, PDL: tl.constexpr, PRECISION: tl.constexpr):
    if FIRST <= 1 and LAST >= 1:  # s1 = attn @ W_o^T + s0
        _stage(a_ptr, wo_ptr, s1_ptr, g_ptr, s0_ptr, bar_ptr, eps, H, A, ROWS, BN_O, BLOCK_K,
               AHEAD, False, False, True, GRID, False, PDL, False, PRECISION)
    if FIRST <= 2 and LAST >= 2:  # gu = rms_norm(s1) @ W_gate_up^T
        _stage(s1_ptr, wgu_ptr, gu_ptr, g_ptr, gu_ptr, bar_ptr, eps, 2 * INTER, H, ROWS,
               BN_GU, BLOCK_K, AHEAD, True, False, False, GRID, SYNC, PDL, False, PRECISION)
    if FIRST <= 3 and LAST >= 3:  # out = silu(gate) * up @ W_down^T + s1
        _stage(gu_ptr, wd_ptr, out_ptr, g_ptr, s1_ptr, bar_ptr, eps, H, INTER, ROWS, BN_D,
               BLOCK_K, AHEAD, False, True, True, GRID, SYNC, PDL, PDL, PRECISION)


@functools.cache
def _barrier(device: torch.device) -> torch.Tensor:
    if torch.cuda.is_available() and device.type == "cuda" and \
            torch.cuda.is_current_stream_capturing():
        raise RuntimeError("layer_mlp: the first call on a device must come before a CUDA "
                           "graph capture (it allocates the grid barrier's counter)")
    return torch.zeros(1, dtype=torch.int32, device=device)


def resident_programs(fn_handle: int, threads: int, shared: int) -> int:
    """Programs of a compiled kernel (its CUfunction handle) of `threads` threads and
    `shared` bytes of dynamic shared memory that fit on one multiprocessor at once (the
    driver's occupancy calculator)."""
    from cuda.bindings import driver

    err, n = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        driver.CUfunction(fn_handle), threads, shared)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
    return int(n)


def layer_mlp(attn: torch.Tensor, stream: torch.Tensor, w_o: torch.Tensor, norm: torch.Tensor,
              eps: float, w_gate_up: torch.Tensor, w_down: torch.Tensor,
              config: StreamConfig, *, staged: bool = False,
              grid: int | None = None) -> torch.Tensor:
    """From the attention output to the layer's output in one persistent launch:
    s1 = attn @ w_o^T + stream; out = silu_mul(rms_norm(s1, norm, eps) @ w_gate_up^T)
    @ w_down^T + s1.

    Args:
        attn: [M <= 4, A] attention output, contiguous.
        stream: [M, H] the residual stream entering the layer (the o_proj residual).
        w_o: [H, A]; norm: [H] (post-attention RMSNorm weight); w_gate_up: [2I, H] as
            `MergedLinear` stacks [gate | up]; w_down: [H, I]. All contiguous, attn's dtype
            and device.
        config: the tiles (`StreamConfig`); its block_k must divide A, H and I.
        staged: one launch per stage, no grid barrier (always so under TRITON_INTERPRET=1).
        grid: programs per launch; default per_sm x the multiprocessors (CUDA) or 4.
    Returns:
        out [M, H] in attn.dtype: what `dlrt.layers.gemv_layer`'s o_proj, gate-up and down
        GEMVs compute (same roundings; fp32 sums in another order).
    Raises:
        ValueError: a tensor of the wrong shape, strides, dtype or device, or a config that
            does not fit.
        RuntimeError: the configuration cannot keep `grid` programs resident (the barrier
            would never open), or the first call on a device is made during a graph capture.
    """
    bad = any(t.dim() != 2 for t in (attn, stream, w_o, w_gate_up, w_down))
    m, a = attn.shape if attn.dim() == 2 else (0, 0)
    h, i = w_down.shape if w_down.dim() == 2 else (0, 0)
    shapes = {"attn": (attn, (m, a)), "stream": (stream, (m, h)), "w_o": (w_o, (h, a)),
              "norm": (norm, (h,)), "w_gate_up": (w_gate_up, (2 * i, h)),
              "w_down": (w_down, (h, i))}
    if bad or m > FMA_ROWS:
        raise ValueError(f"layer_mlp: attn {tuple(attn.shape)} must be [M<={FMA_ROWS}, A] and "
                         "the weights 2-D")
    for name, (t, want) in shapes.items():
        if tuple(t.shape) != want or not t.is_contiguous():
            raise ValueError(f"layer_mlp: {name} {tuple(t.shape)} is not a contiguous {want}")
        if t.dtype != attn.dtype or t.device != attn.device:
            raise ValueError(f"layer_mlp: {name} is {t.dtype} on {t.device}, attn is "
                             f"{attn.dtype} on {attn.device}")
    if not config.fits(a, h, i):
        raise ValueError(f"layer_mlp: {config} does not fit A={a}, H={h}, I={i}")
    out = torch.empty_like(stream)
    if m == 0:
        return out
    s1 = torch.empty_like(stream)
    gu = torch.empty((m, 2 * i), dtype=attn.dtype, device=attn.device)
    staged = staged or not attn.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if grid is None:
        grid = 4 if not attn.is_cuda else config.per_sm * \
            torch.cuda.get_device_properties(attn.device).multi_processor_count
    bar = _barrier(attn.device) if attn.is_cuda and not staged else out
    args = (attn, stream, w_o, norm, w_gate_up, w_down, s1, gu, out, bar, float(eps))
    consts = dict(H=h, A=a, INTER=i, ROWS=m, BN_O=config.stage_block_n(h, grid),
                  BN_GU=config.stage_block_n(2 * i, grid), BN_D=config.stage_block_n(h, grid),
                  BLOCK_K=config.block_k, AHEAD=config.stages, GRID=grid,
                  PRECISION="ieee" if attn.dtype == torch.float32 else "tf32",
                  num_warps=config.warps)
    opts = pdl.launch_options(attn)
    if staged:
        for s in (1, 2, 3):
            _layer_mlp_kernel[(grid,)](*args, **consts, FIRST=s, LAST=s, SYNC=False, **opts)
        return out
    _check_resident(args, consts, opts, grid, config, attn.device)
    _layer_mlp_kernel[(grid,)](*args, **consts, FIRST=1, LAST=3, SYNC=True, **opts)
    return out


_RESIDENT: set = set()  # (device, constexprs) already checked


def _check_resident(args, consts, opts, grid, config, device) -> None:
    """Raise unless `grid` programs of this compiled kernel fit on the device at once."""
    key = (device, tuple(sorted(consts.items())), tuple(sorted(opts.items())))
    if key in _RESIDENT:
        return
    kernel = _layer_mlp_kernel.warmup(*args, **consts, FIRST=1, LAST=3, SYNC=True, **opts,
                                      grid=(grid,))
    kernel._init_handles()
    threads = 32 * config.warps
    shared = kernel.metadata.shared
    per_sm = resident_programs(kernel.function, threads, shared)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if grid > per_sm * sms:
        raise RuntimeError(f"layer_mlp: {grid} programs of {config} cannot all be resident "
                           f"({per_sm} per multiprocessor x {sms}); lower per_sm")
    _RESIDENT.add(key)
