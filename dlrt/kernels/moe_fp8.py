"""FP8 expert weights in the fused MoE kernels (`dlrt.kernels.moe`): float8_e4m3fn experts
read directly, each touched expert's FP8 bytes once per call.

w13 float8_e4m3fn [E, 2I, H], w2 float8_e4m3fn [E, H, I] with float32 scales s13 / s2 in one of
three layouts (held by `StackedExperts`), told apart by the scales' shapes
(`check_fp8_experts`):
  block rows (`dlrt.layers.quant.fp8.FP8_FORMAT`: the checkpoint's 128 x 128 blocks, I a
      multiple of 128, so the gate and up parts' block rows concatenate): s13 [E, ceil(2I/128),
      ceil(H/128)], s2 [E, ceil(H/128), ceil(I/128)]; ROW_BLOCK 128;
  a row per weight row (`FP8_ROWS_FORMAT`: 128 x 128 blocks for any I, e.g. DiffusionGemma's
      704, each block's scale repeated on its rows): s13 [E, 2I, ceil(H/128)], s2 [E, H,
      ceil(I/128)]; ROW_BLOCK 1;
  per channel (`dlrt.layers.quant.compressed_tensors`: one scale per weight row for the whole
      of K; a per-tensor scale repeated on its rows): s13 [E, 2I, 1], s2 [E, H, 1]; ROW_BLOCK
      1, one scale column;
  dequant(w)[e, r, c] = w[e, r, c] * s[e, r // ROW_BLOCK, min(c // 128, SCALE_COLS - 1)],
      SCALE_COLS the scales' last dimension (a constexpr of each launch).
The kernels' K steps (BLOCK_K) divide 128, so a step lies in one scale column; the scale is
gathered per output column (row r of the weight) and step.

  "rows" form: the e4m3 tile is converted to fp32 in registers and multiplied by its block's
      scale (one fp32 product, exactly the reference's fp32 dequantised weight), then used
      as in the BF16 path (fp32 FMAs).
  "tiles" form: the e4m3 tile is converted to x's dtype (exact: every e4m3 value is a bf16 /
      fp16 / fp32 value), multiplied with the gathered rows into a fresh fp32 partial sum
      (`tl.dot`), which is scaled per column by the step's block scale and added to the fp32
      accumulator (as `dlrt.kernels.fp8_gemm`). For bf16 x the dot runs on fp16 operands
      instead: the e4m3 tile converts to fp16 with one packed instruction per two values
      (to bf16 it takes three: e4m3 -> fp16 -> bf16, and the conversions bound the loop), and
      each gathered row of the step is scaled by a power of two into fp16's range
      (`dlrt.kernels.e4m3.f16_rows`; exact for all but values below 2^-28 of the row's
      largest), the partial sum scaled back: the same exact products, fp32 sums.
Numerics against `ReferenceMoE` on the dequantised experts: fp32 x: fp32 summation order only;
bf16 x: the kernels keep the dequantised weight in fp32 (rows) or scale exact products (tiles)
where the reference rounds the dequantised weight to bf16 first.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from dlrt.kernels.e4m3 import f16_rows

FP8 = torch.float8_e4m3fn
QBLOCK = 128
# Tiles form: 128-column K steps per loop iteration. FP8 steps are 128 columns (one scale
# column) where BF16 takes 256, so one iteration of one step holds half the bytes in flight.
FP8_UNROLL = 2


@triton.jit
def _scale_rows(s_ptr, expert, n, N_OUT, GATED: tl.constexpr, ROW_BLOCK: tl.constexpr,
                SCALE_COLS: tl.constexpr):
    """Pointers to the scale rows of output columns n (clamped) of `expert`: (gate or the
    weight, up), each [BLOCK_N]; add a step's scale column (`_scale_col`). ROW_BLOCK: weight
    rows per scale row (128: block rows; 1: a scale row per weight row); SCALE_COLS: scale
    columns per row (ceil(K/128), or 1 per channel)."""
    w_rows = 2 * N_OUT if GATED else N_OUT
    base = s_ptr + expert * ((w_rows + ROW_BLOCK - 1) // ROW_BLOCK) * SCALE_COLS
    nc = tl.minimum(n, N_OUT - 1)
    s_w = base + (nc // ROW_BLOCK) * SCALE_COLS
    s_v = s_w
    if GATED:
        s_v = base + ((N_OUT + nc) // ROW_BLOCK) * SCALE_COLS
    return s_w, s_v


@triton.jit
def _scale_col(k0, SCALE_COLS: tl.constexpr):
    """The scale column of the K step starting at column k0: its 128-column block, the one
    column of per-channel scales."""
    return tl.minimum(k0 // 128, SCALE_COLS - 1)


@triton.jit
def _fp8_dot(a, a16, down, w_ptrs, PRECISION: tl.constexpr):
    """The fp32 partial sum a @ w^T of one K step, w the e4m3 tile at w_ptrs: for bf16 a, the
    fp16 dot of `dlrt.kernels.e4m3.f16_rows`' rows (a16, down) with the tile converted to
    fp16 (one packed conversion per two values; e4m3 -> bf16 goes through fp16 and costs
    three), scaled back by 2^-s."""
    if a.dtype == tl.bfloat16:
        w = tl.load(w_ptrs).to(tl.float16)
        part = tl.dot(a16, tl.trans(w), out_dtype=tl.float32) * down[:, None]
    else:
        w = tl.load(w_ptrs).to(a.dtype)
        part = tl.dot(a, tl.trans(w), input_precision=PRECISION, out_dtype=tl.float32)
    return part


@triton.jit
def _fp8_tiles(acc, acc_up, rows, slab, s_ptr, expert, n, N_OUT, K: tl.constexpr,
               GATED: tl.constexpr, BLOCK_K: tl.constexpr, UNROLL: tl.constexpr,
               PRECISION: tl.constexpr, ROW_BLOCK: tl.constexpr, SCALE_COLS: tl.constexpr):
    """The tiles form's main loop on an FP8 slab (see the module docstring): UNROLL K steps
    of BLOCK_K per iteration (K a multiple of BLOCK_K * UNROLL), so each pipeline stage
    holds UNROLL steps' loads; the steps are summed in the same order whatever UNROLL is."""
    s_w, s_v = _scale_rows(s_ptr, expert, n, N_OUT, GATED, ROW_BLOCK, SCALE_COLS)
    for t in range(0, K // (BLOCK_K * UNROLL)):
        for u in tl.static_range(UNROLL):
            k0 = (t * UNROLL + u) * BLOCK_K
            a = tl.load(rows + k0)
            a16, down = a, tl.zeros([a.shape[0]], tl.float32)
            if a.dtype == tl.bfloat16:
                a16, down = f16_rows(a)
            kb = _scale_col(k0, SCALE_COLS)
            part = _fp8_dot(a, a16, down, slab + k0, PRECISION)
            acc += part * tl.load(s_w + kb)[None, :]
            if GATED:
                part = _fp8_dot(a, a16, down, slab + N_OUT * K + k0, PRECISION)
                acc_up += part * tl.load(s_v + kb)[None, :]
    return acc, acc_up


def fp8_steps(cfg):
    """The config with K steps of at most 128 (a step in one scale column; the steps are
    powers of two, so they divide 128) and the tiles form's steps per loop iteration
    (`unroll`; None: `FP8_UNROLL`)."""
    return dataclasses.replace(cfg, up_k=min(cfg.up_k, QBLOCK), down_k=min(cfg.down_k, QBLOCK),
                               unroll=cfg.unroll or FP8_UNROLL)


def unroll_for(k: int, block_k: int, want: int) -> int:
    """The most K steps per iteration, at most `want`, that divide the K // block_k steps."""
    steps = k // block_k
    return max(u for u in range(1, max(want, 1) + 1) if steps % u == 0)


def check_fp8_experts(w13: torch.Tensor, w2: torch.Tensor, s13: torch.Tensor,
                      s2: torch.Tensor) -> int:
    """The scales' ROW_BLOCK (weight rows per scale row: 128 for block rows, I a multiple
    of 128; 1 for a scale row per weight row, block columns or per channel; module
    docstring). A launch's SCALE_COLS is its scales' last dimension.

    Raises:
        ValueError: weights not float8_e4m3fn, or scales in none of the layouts.
    """
    e, two_i, h = w13.shape
    i, cdiv = two_i // 2, triton.cdiv
    layouts = [(1, ((e, two_i, cdiv(h, QBLOCK)), (e, h, cdiv(i, QBLOCK)))),
               (1, ((e, two_i, 1), (e, h, 1)))]
    if i % QBLOCK == 0:
        layouts.insert(0, (QBLOCK, ((e, cdiv(two_i, QBLOCK), cdiv(h, QBLOCK)),
                                    (e, cdiv(h, QBLOCK), cdiv(i, QBLOCK)))))
    shapes = (tuple(s13.shape), tuple(s2.shape))
    block = next((b for b, want in layouts if shapes == want), None)
    if w13.dtype != FP8 or w2.dtype != FP8 or s13.dtype != torch.float32 \
            or s2.dtype != torch.float32 or block is None:
        raise ValueError(f"fused_experts (fp8): w13 {tuple(w13.shape)} {w13.dtype}, w2 "
                         f"{tuple(w2.shape)} {w2.dtype} need float8_e4m3fn weights and "
                         f"float32 scales in block rows (I a multiple of {QBLOCK}), a row "
                         f"per weight row or per channel: one of {[w for _, w in layouts]}; "
                         f"got {list(shapes)} {s13.dtype} / {s2.dtype}")
    return block
