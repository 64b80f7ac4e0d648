"""Fused routed experts: y[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) for a MoE layer.

expert_e(x) = w2[e] @ (act(w13[e, :I] @ x) * (w13[e, I:] @ x)), the gated expert of
`dlrt.layers.moe.StackedExperts` (w13 [E, 2I, H]: gate rows then up rows; w2 [E, H, I]); act is
SiLU (SwiGLU) or transformers' gelu_pytorch_tanh (Gemma; `dlrt.kernels.activation.gate_act`), a
constexpr of the gate-up launch.
Numerics follow `dlrt.layers.moe.reference.ReferenceMoE.apply`: fp32 accumulation, gate and
up rounded to x's dtype, act(gate) rounded to x's dtype, times up rounded to x's dtype (the
intermediate), the expert
output rounded to x's dtype and multiplied by the routing weight in fp32, the k products of a
token summed in fp32 in the order j = 0..k-1, then cast to x's dtype.

Four launches, all of fixed shapes with no host sync (capturable; eager, captured and replayed
calls compute identically, no atomics):
  1. `moe_align.align_pairs`: the N*k pairs grouped by expert into tiles (one program);
  2. gate-up: per (tile, column block of I) the expert's w13 rows are read once and applied to
     every pair of the tile -> act [N*k, I] (x's dtype);
  3. down: per (tile, column block of H) the w2 rows are read once -> y [N*k, H] fp32, already
     weighted;
  4. combine: out[t] = sum_j y[t*k + j] (fixed order).
Two forms of 2 and 3, chosen from the static shape (`moe_form`, `moe_config`):
  "rows" (GEMV, the fewest rows): one tile per touched expert holding all its pairs; a
     program streams its [BLOCK_N, H] weight slab in [BLOCK_N, BLOCK_K] steps
     and multiplies up to `rows` pairs per pass with CUDA-core FMAs (runs of VEC products
     summed in a thread); pairs past `rows` take further passes over the slab (from L2).
     Grid (min(E, N*k), cdiv(I or H, BLOCK_N)): split over the outputs, never over K.
  "tiles" (grouped GEMM: denoising blocks, canvases, prefill): tiles of at most BLOCK_M pairs
     of one expert, a tensor-core `tl.dot` of the gathered rows against the weight tile
     (software-pipelined by Triton); an expert's tiles run side by side, so its weights come
     from HBM once and from L2 for its further tiles.
     Grid (N*k // BLOCK_M + min(E, N*k), cdiv(I or H, BLOCK_N)).
Programs past the live tile count (read from device memory) exit at once. Buffers are sized
by N*k, never by the experts touched.
FP8 experts (float8_e4m3fn w13 / w2 with 128 x 128 block scales held in block rows or a row per
weight row, or per-channel scales, `dlrt.kernels.moe_fp8`): the same launches with the
constexpr FP8 on (and ROW_BLOCK, SCALE_COLS: the scales' layout); both forms load the e4m3
tiles, convert them in registers and apply each step's scale (fp32 accumulation), so a
touched expert's FP8 bytes are read once per call; the activation of the gate rows is the same
constexpr as without FP8. FP8 off compiles the BF16 code unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl
from dlrt.kernels.activation import GATE_ACTIVATIONS, gate_act
from dlrt.kernels.moe_align import align_pairs, max_tiles
from dlrt.kernels.moe_fp8 import (
    _fp8_tiles,
    _scale_col,
    _scale_rows,
    check_fp8_experts,
    fp8_steps,
    unroll_for,
)

# The form rule. Measured on an H200 (bf16, SDAR-30B-A3B and LLaDA2.0-mini experts): the
# tiles form at BLOCK_M = 16 streams the touched experts at 0.87-0.99 of the copy bandwidth
# for 4-64 rows (the rows form 0.65-0.77); at one row (8 pairs) the two tie. So the rows form
# runs up to ROWS_FORM_MAX_PAIRS pairs, the tiles form above.
ROWS_FORM_MAX_PAIRS = 8
ROWS_PER_PASS = 4  # rows form: accumulators per pass over a weight slab (1..4)
VEC = 8  # rows form: products summed inside a thread before the cross-thread reduction


def moe_form(n: int, k: int, e: int) -> str:
    """"rows" (GEMV) or "tiles" (grouped GEMM) for N rows, top-k, E experts: a pure function
    of the static shape, so every execution mode computes the same way (E: unused by the
    measured rule)."""
    return "rows" if n * k <= ROWS_FORM_MAX_PAIRS else "tiles"


@dataclass(frozen=True)
class MoEConfig:
    form: str  # "rows" | "tiles"
    rows: int = ROWS_PER_PASS  # rows form: pairs per pass (static accumulators)
    block_m: int = 16  # tiles form: the most pairs in a tile
    up_n: int = 32  # gate-up: columns of I per program (gate and up rows each)
    up_k: int = 128  # gate-up: H per step
    down_n: int = 32  # down: columns of H per program
    down_k: int = 128  # down: I per step
    warps: int = 4
    stages: int = 3  # tiles form: Triton's pipeline depth
    unroll: int | None = None  # FP8 tiles form: K steps per loop iteration (None: FP8_UNROLL)


def _block_k(size: int, cap: int) -> int:
    """The largest power of two <= cap dividing size (no K masks in the kernels)."""
    b = 1
    while b < cap and size % (2 * b) == 0:
        b *= 2
    return b


def moe_config(n: int, k: int, e: int, hidden: int, inter: int) -> MoEConfig:
    """Block sizes for x [n, hidden], top-k of e experts of intermediate size `inter` (the
    best measured on an H200). The tiles form needs hidden and inter multiples of 16 (tl.dot);
    otherwise rows. BLOCK_M follows the mean pairs per touched expert (16 to 64)."""
    form = moe_form(n, k, e)
    if form == "tiles" and (hidden % 16 or inter % 16):
        form = "rows"
    if form == "rows":
        return MoEConfig("rows", rows=min(ROWS_PER_PASS, triton.next_power_of_2(n)), up_n=32,
                         up_k=_block_k(hidden, 128), down_n=32, down_k=_block_k(inter, 128))
    per_expert = triton.cdiv(n * k, min(e, n * k))
    block_m = min(64, max(16, triton.next_power_of_2(per_expert)))
    if block_m == 16:  # weight streaming: long steps over H (3 stages fit shared memory)
        return MoEConfig("tiles", block_m=16, up_n=64, up_k=_block_k(hidden, 256), down_n=64,
                         down_k=_block_k(inter, 128), warps=4, stages=3)
    return MoEConfig("tiles", block_m=block_m, up_n=64, up_k=_block_k(hidden, 64), down_n=64,
                     down_k=_block_k(inter, 64), warps=4, stages=3)


@triton.jit
def _epilogue(acc, acc_up, p, ok, n, out_ptr, wt_ptr, N_OUT, GATED: tl.constexpr,
              ACTIVATION: tl.constexpr, dtype: tl.constexpr):
    """Store the outputs of pairs p (any shape broadcasting with n): gated: act(gate) * up
    rounded like the reference into act [N*k, N_OUT]; else the expert output rounded to x's
    dtype times the pair's weight, into y [N*k, N_OUT] fp32."""
    if GATED:
        g = acc.to(dtype).to(tl.float32)
        u = acc_up.to(dtype).to(tl.float32)
        act = gate_act(g, ACTIVATION).to(dtype).to(tl.float32)
        tl.store(out_ptr + p.to(tl.int64) * N_OUT + n, (act * u).to(dtype), mask=ok)
    else:
        w = tl.load(wt_ptr + p)  # p is a real pair (clamped)
        tl.store(out_ptr + p.to(tl.int64) * N_OUT + n, acc.to(dtype).to(tl.float32) * w,
                 mask=ok)


@triton.jit
def _fma(acc, w, x, VEC: tl.constexpr):
    """acc [BLOCK_N, BLOCK_K // VEC] += w [BLOCK_N, BLOCK_K] * x [BLOCK_K], runs of VEC
    adjacent products summed inside a thread."""
    prod = w * x.to(tl.float32)[None, :]
    return acc + tl.sum(tl.reshape(prod, [acc.shape[0], acc.shape[1], VEC]), axis=2)


@triton.jit
def _row(acc, acc_up, w, v, src, in_k, GATED: tl.constexpr, VEC: tl.constexpr):
    x = tl.load(in_k + src)
    acc = _fma(acc, w, x, VEC)
    if GATED:
        acc_up = _fma(acc_up, v, x, VEC)
    return acc, acc_up


@triton.jit
def _row_out(acc, acc_up, pairs_ptr, c, r: tl.constexpr, count, n, out_ptr, wt_ptr, N_OUT,
             GATED: tl.constexpr, ACTIVATION: tl.constexpr, dtype: tl.constexpr):
    p = tl.load(pairs_ptr + tl.minimum(c + r, count - 1))
    ok = n < tl.where(c + r < count, N_OUT, 0)  # a row past the tile's pairs stores nothing
    _epilogue(tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), p, ok, n, out_ptr, wt_ptr, N_OUT,
              GATED, ACTIVATION, dtype)


@triton.jit
def _rows_kernel(in_ptr, w_ptr, s_ptr, out_ptr, table_ptr, wt_ptr, T, N_OUT, K: tl.constexpr,
                 TOPK: tl.constexpr, GATED: tl.constexpr, ACTIVATION: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 VEC: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr,
                 ROW_BLOCK: tl.constexpr = 128, SCALE_COLS: tl.constexpr = 1):
    tile = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    dtype = in_ptr.dtype.element_ty
    pdl.wait(PDL)
    if tile >= tl.load(table_ptr):
        return
    expert = tl.load(table_ptr + 1 + 3 * tile).to(tl.int64)
    count = tl.load(table_ptr + 3 + 3 * tile)
    pairs_ptr = table_ptr + 1 + 3 * T + tl.load(table_ptr + 2 + 3 * tile)
    w_rows = 2 * N_OUT if GATED else N_OUT
    slab = w_ptr + expert * w_rows * K + tl.minimum(n, N_OUT - 1).to(tl.int64)[:, None] * K \
        + k[None, :]  # clamped rows: no load masks
    if FP8:
        s_w, s_v = _scale_rows(s_ptr, expert, n, N_OUT, GATED, ROW_BLOCK, SCALE_COLS)
    TILES: tl.constexpr = K // BLOCK_K
    for c in range(0, count, ROWS):
        srcs = tl.load(pairs_ptr + tl.minimum(c + tl.arange(0, ROWS), count - 1))
        if GATED:
            srcs = srcs // TOPK  # the pair's token
        srcs = srcs.to(tl.int64) * K  # the rows' offsets in the input (row r: s_r)
        s0 = tl.sum(tl.where(tl.arange(0, ROWS) == 0, srcs, 0), axis=0)
        s1 = tl.sum(tl.where(tl.arange(0, ROWS) == 1, srcs, 0), axis=0)
        s2 = tl.sum(tl.where(tl.arange(0, ROWS) == 2, srcs, 0), axis=0)
        s3 = tl.sum(tl.where(tl.arange(0, ROWS) == 3, srcs, 0), axis=0)
        a0 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
        a1, a2, a3, b0, b1, b2, b3 = a0, a0, a0, a0, a0, a0, a0
        w_next = tl.load(slab)
        v_next = w_next
        if GATED:
            v_next = tl.load(slab + N_OUT * K)
        for t in range(0, TILES):
            w, v = w_next.to(tl.float32), v_next.to(tl.float32)
            if FP8:  # the tile dequantised in registers (fp32, as the reference's weight)
                kb = _scale_col(t * BLOCK_K, SCALE_COLS)
                w = w * tl.load(s_w + kb)[:, None]
                if GATED:
                    v = v * tl.load(s_v + kb)[:, None]
            ahead = tl.minimum(t + 1, TILES - 1) * BLOCK_K  # the next step in flight
            w_next = tl.load(slab + ahead)
            if GATED:
                v_next = tl.load(slab + N_OUT * K + ahead)
            in_k = in_ptr + t * BLOCK_K + k
            a0, b0 = _row(a0, b0, w, v, s0, in_k, GATED, VEC)
            if ROWS > 1:
                if c + 1 < count:
                    a1, b1 = _row(a1, b1, w, v, s1, in_k, GATED, VEC)
            if ROWS > 2:
                if c + 2 < count:
                    a2, b2 = _row(a2, b2, w, v, s2, in_k, GATED, VEC)
                if c + 3 < count:
                    a3, b3 = _row(a3, b3, w, v, s3, in_k, GATED, VEC)
        _row_out(a0, b0, pairs_ptr, c, 0, count, n, out_ptr, wt_ptr, N_OUT, GATED,
                 ACTIVATION, dtype)
        if ROWS > 1:
            _row_out(a1, b1, pairs_ptr, c, 1, count, n, out_ptr, wt_ptr, N_OUT, GATED,
                     ACTIVATION, dtype)
        if ROWS > 2:
            _row_out(a2, b2, pairs_ptr, c, 2, count, n, out_ptr, wt_ptr, N_OUT, GATED,
                     ACTIVATION, dtype)
            _row_out(a3, b3, pairs_ptr, c, 3, count, n, out_ptr, wt_ptr, N_OUT, GATED,
                     ACTIVATION, dtype)
    pdl.release(PDL)


@triton.jit
def _tiles_kernel(in_ptr, w_ptr, s_ptr, out_ptr, table_ptr, wt_ptr, T, N_OUT, K: tl.constexpr,
                  TOPK: tl.constexpr, GATED: tl.constexpr, ACTIVATION: tl.constexpr,
                  BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                  FP8: tl.constexpr, PDL: tl.constexpr, UNROLL: tl.constexpr = 1,
                  ROW_BLOCK: tl.constexpr = 128, SCALE_COLS: tl.constexpr = 1):
    tile = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    pdl.wait(PDL)
    if tile >= tl.load(table_ptr):
        return
    expert = tl.load(table_ptr + 1 + 3 * tile).to(tl.int64)
    count = tl.load(table_ptr + 3 + 3 * tile)
    pairs_ptr = table_ptr + 1 + 3 * T + tl.load(table_ptr + 2 + 3 * tile)
    p = tl.load(pairs_ptr + tl.minimum(m, count - 1))  # clamped: rows past count repeat
    src = p // TOPK if GATED else p
    rows = in_ptr + src.to(tl.int64)[:, None] * K + k[None, :]
    w_rows = 2 * N_OUT if GATED else N_OUT
    slab = w_ptr + expert * w_rows * K + tl.minimum(n, N_OUT - 1).to(tl.int64)[:, None] * K \
        + k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = acc
    if FP8:
        acc, acc_up = _fp8_tiles(acc, acc_up, rows, slab, s_ptr, expert, n, N_OUT, K, GATED,
                                 BLOCK_K, UNROLL, PRECISION, ROW_BLOCK, SCALE_COLS)
    else:
        for t in range(0, K // BLOCK_K):
            a = tl.load(rows + t * BLOCK_K)
            acc = tl.dot(a, tl.trans(tl.load(slab + t * BLOCK_K)), acc,
                         input_precision=PRECISION)
            if GATED:
                acc_up = tl.dot(a, tl.trans(tl.load(slab + N_OUT * K + t * BLOCK_K)), acc_up,
                                input_precision=PRECISION)
    pdl.release(PDL)
    ok = (m < count)[:, None] & (n < N_OUT)[None, :]
    _epilogue(acc, acc_up, p[:, None], ok, n[None, :], out_ptr, wt_ptr, N_OUT, GATED,
              ACTIVATION, in_ptr.dtype.element_ty)


@triton.jit
def _combine_kernel(y_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr):
    pdl.begin(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = h < H
    acc = tl.load(y_ptr + t * TOPK * H + h, mask=ok, other=0.0)
    for j in tl.static_range(1, TOPK):  # fixed order: deterministic
        acc += tl.load(y_ptr + (t * TOPK + j) * H + h, mask=ok, other=0.0)
    tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=ok)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                  ids: torch.Tensor, config: MoEConfig | None = None,
                  w13_scale: torch.Tensor | None = None,
                  w2_scale: torch.Tensor | None = None, activation: str = "silu"
                  ) -> torch.Tensor:
    """The routed experts of a MoE layer (see the module docstring).

    Args:
        x: [N, H] activations. w13: [E, 2I, H], w2: [E, H, I], x's dtype and device; or
            float8_e4m3fn with `w13_scale` / `w2_scale`, float32 128 x 128 block scales in
            block rows ([E, ceil(2I/128), ceil(H/128)] / [E, ceil(H/128), I/128], I a
            multiple of 128) or a row per weight row ([E, 2I, ceil(H/128)] / [E, H,
            ceil(I/128)]), or per-channel scales ([E, 2I, 1] / [E, H, 1]): read as FP8 by
            the kernels (`dlrt.kernels.moe_fp8`).
        weights: [N, k] fp32 routing weights. ids: [N, k] expert ids (int32 or int64).
        config: block sizes and form; None: `moe_config` of the shape (FP8: K steps capped
            at 128).
        activation: the gate rows' activation, "silu" or "gelu_pytorch_tanh".
    Returns:
        [N, H] in x's dtype, a new tensor.
    Raises:
        ValueError: shapes or dtypes that do not fit, an unknown activation.
    """
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(f"fused_experts: activation {activation!r} is not one of "
                         f"{GATE_ACTIVATIONS}")
    n, h = x.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    k = ids.shape[1]
    fp8 = w13_scale is not None
    row_block = check_fp8_experts(w13, w2, w13_scale, w2_scale) if fp8 else 128
    if w13.shape[2] != h or w2.shape != (e, h, inter) or weights.shape != ids.shape \
            or ids.shape[0] != n or (not fp8 and (w13.dtype != x.dtype or w2.dtype != x.dtype)):
        raise ValueError(f"fused_experts: x {tuple(x.shape)} {x.dtype}, w13 "
                         f"{tuple(w13.shape)} {w13.dtype}, w2 {tuple(w2.shape)} {w2.dtype}, "
                         f"weights {tuple(weights.shape)}, ids {tuple(ids.shape)} do not fit")
    cfg = config or moe_config(n, k, e, h, inter)
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    s13 = s2 = w13  # unused without FP8
    if fp8:
        cfg, s13, s2 = fp8_steps(cfg), w13_scale.contiguous(), w2_scale.contiguous()
    weights, ids = weights.float().contiguous(), ids.contiguous()
    out = torch.empty_like(x)
    if n == 0:
        return out
    nk = n * k
    tile_rows = nk if cfg.form == "rows" else cfg.block_m
    table = align_pairs(ids, e, tile_rows)
    tiles = max_tiles(nk, e, tile_rows)
    act = torch.empty((nk, inter), dtype=x.dtype, device=x.device)
    y = torch.empty((nk, h), dtype=torch.float32, device=x.device)
    opts = pdl.launch_options(x)
    steps = ((x, w13, s13, act, inter, h, cfg.up_n, cfg.up_k, True),
             (act, w2, s2, y, h, inter, cfg.down_n, cfg.down_k, False))
    for src, w, scale, dst, n_out, kdim, block_n, block_k, gated in steps:
        grid = (tiles, triton.cdiv(n_out, block_n))
        cols = scale.shape[2] if fp8 else 1  # the scales' columns (SCALE_COLS)
        if cfg.form == "rows":
            _rows_kernel[grid](src, w, scale, dst, table, weights, tiles, n_out, K=kdim,
                               TOPK=k, GATED=gated, ACTIVATION=activation, ROWS=cfg.rows,
                               BLOCK_N=block_n, BLOCK_K=block_k, VEC=min(VEC, block_k), FP8=fp8,
                               ROW_BLOCK=row_block, SCALE_COLS=cols, num_warps=cfg.warps,
                               num_stages=1, **opts)
        else:
            _tiles_kernel[grid](src, w, scale, dst, table, weights, tiles, n_out, K=kdim,
                                TOPK=k, GATED=gated, ACTIVATION=activation,
                                BLOCK_M=cfg.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                                FP8=fp8, UNROLL=unroll_for(kdim, block_k, cfg.unroll or 1)
                                if fp8 else 1, ROW_BLOCK=row_block, SCALE_COLS=cols,
                                num_warps=cfg.warps, num_stages=cfg.stages, **opts)
    block = min(1024, triton.next_power_of_2(h))
    _combine_kernel[(n, triton.cdiv(h, block))](y, out, h, TOPK=k, BLOCK=block, num_warps=4,
                                                **opts)
    return out
