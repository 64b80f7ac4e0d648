"""Soft embeddings: softmax(x) @ E for logits x [n, V] and an embedding matrix E [V, d], in one
pass over the vocabulary, without the [n, V] probabilities (DiffusionGemma's self-conditioning
input).

Flash attention with the scores given: each program owns a tile of BLOCK_M rows and BLOCK_D
columns of the output over one split of the vocabulary, and steps through it BLOCK_V tokens at
a time holding the rows' running max m and sum z of exp(x - m) and the fp32 accumulator
sum exp(x - m) E, rescaled by exp(m_old - m_new) when a max grows; exp(x - m) enters the
tensor-core product in E's dtype. A second kernel merges the splits (each moved to the rows'
max) and divides by the sum. Programs of one split run side by side (the grid's fastest axes
are the output tiles), so a split's logits and embedding rows come from HBM once and from L2
for the other tiles. Reference: Dao et al., FlashAttention (online softmax), and the split-K
merge of flash decoding.

Numerics against `(softmax(x, fp32).to(E.dtype) @ E) * scale` (`dlrt.ops.reference`): fp32
E: fp32 sums in another order (within 1e-5 relative); bf16 E: the reference rounds each
probability to bf16 and its product's output to bf16, the kernel rounds exp(x - m) to bf16
(the same relative error, other values) and the fp32 result once, so the two agree to bf16
rounding (about 2^-8 relative). The scale is rounded to E's dtype and applied to the rounded
product in that dtype, as the reference's multiply is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl

TARGET_PROGRAMS = 264  # programs of the main pass: vocabulary splits are added up to this


@dataclass(frozen=True)
class SoftEmbeddingConfig:
    block_m: int  # rows per program
    block_d: int  # output columns per program
    block_v: int  # vocabulary per step
    splits: int  # vocabulary splits (programs per output tile)
    warps: int = 8
    stages: int = 3


def soft_embedding_config(n: int, v: int, d: int) -> SoftEmbeddingConfig:
    """Block sizes and vocabulary splits for x [n, v], E [v, d]: a pure function of the shape
    (every execution mode computes the same way). tl.dot needs tiles of at least 16."""
    block_m = min(128, max(16, triton.next_power_of_2(n)))
    block_d = min(128, max(16, triton.next_power_of_2(d)))
    block_v = 64
    tiles = triton.cdiv(n, block_m) * triton.cdiv(d, block_d)
    splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, tiles), triton.cdiv(v, 8 * block_v)))
    return SoftEmbeddingConfig(block_m, block_d, block_v, splits)


@triton.jit
def _split_kernel(x_ptr, w_ptr, part_ptr, stat_ptr, N, V, D, V_SPLIT, BLOCK_M: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, PRECISION: tl.constexpr,
                  PDL: tl.constexpr):
    """Split s of the vocabulary for a [BLOCK_M, BLOCK_D] output tile: part[s, rows, cols] =
    sum exp(x - m) E (fp32) and, from the first column tile, stat[s, rows] = (m, z)."""
    pdl.begin(PDL)
    pid_d = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < N
    col_ok = cols < D
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * V
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    z = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    start = split * V_SPLIT
    for i in range(0, V_SPLIT, BLOCK_V):
        v = start + i + tl.arange(0, BLOCK_V)
        v_ok = v < V
        x = tl.load(x_rows + v[None, :], mask=row_ok[:, None] & v_ok[None, :],
                    other=float("-inf")).to(tl.float32)  # [BLOCK_M, BLOCK_V]
        e = tl.load(w_ptr + v.to(tl.int64)[:, None] * D + cols[None, :],
                    mask=v_ok[:, None] & col_ok[None, :], other=0.0)  # [BLOCK_V, BLOCK_D]
        m_new = tl.maximum(m, tl.max(x, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # no NaN while a row is -inf
        alpha = tl.exp(m - base)
        p = tl.exp(x - base[:, None])
        z = z * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(e.dtype), e, input_precision=PRECISION)
        m = m_new
    out = (split * N + rows.to(tl.int64))
    tl.store(part_ptr + out[:, None] * D + cols[None, :], acc,
             mask=row_ok[:, None] & col_ok[None, :])
    if pid_d == 0:
        tl.store(stat_ptr + out * 2, m, mask=row_ok)
        tl.store(stat_ptr + out * 2 + 1, z, mask=row_ok)


@triton.jit
def _merge_kernel(part_ptr, stat_ptr, out_ptr, N, D, scale, SPLITS: tl.constexpr,
                  SPLITS_P2: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[row, cols] = (sum_s part[s] exp(m_s - M) / sum_s z_s exp(m_s - M)) in E's dtype,
    times `scale` (a value of E's dtype) rounded to it."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    s = tl.arange(0, SPLITS_P2)
    s_ok = s < SPLITS
    m = tl.load(stat_ptr + (s * N + row) * 2, mask=s_ok, other=float("-inf"))
    z = tl.load(stat_ptr + (s * N + row) * 2 + 1, mask=s_ok, other=0.0)
    c = tl.exp(m - tl.max(m, axis=0))  # 0 for a split of -inf only; NaN for a row of -inf
    total = tl.sum(tl.where(z > 0, z * c, 0.0), axis=0)
    ok = cols < D
    part = tl.load(part_ptr + (s.to(tl.int64)[:, None] * N + row) * D + cols[None, :],
                   mask=s_ok[:, None] & ok[None, :], other=0.0)
    acc = tl.sum(tl.where(z[:, None] > 0, part * c[:, None], 0.0), axis=0)
    dtype = out_ptr.dtype.element_ty
    y = (acc / total).to(dtype).to(tl.float32) * scale
    tl.store(out_ptr + row * D + cols, y.to(dtype), mask=ok)


def soft_embedding(x: torch.Tensor, weight: torch.Tensor, scale=1.0,
                   config: SoftEmbeddingConfig | None = None) -> torch.Tensor:
    """softmax(x, fp32) @ weight, times `scale`, without the [n, V] probabilities (see the
    module docstring); fixed shapes, no host sync (capturable).

    Args:
        x: [n, V] logits, contiguous, fp32 / bf16 / fp16 (read in fp32).
        weight: [V, d] contiguous (the embedding matrix), fp32 / bf16 / fp16, x's device.
        scale: a number, or a 0-d CPU tensor (DiffusionGemma's `embed_scale`), rounded to
            weight's dtype.
        config: block sizes and splits; None: `soft_embedding_config` of the shape.
    Returns:
        [n, d] in weight's dtype, a new tensor.
    Raises:
        ValueError: x or weight not contiguous 2-D tensors of matching V, or a scale on
            another device than the CPU.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[0] \
            or not x.is_contiguous() or not weight.is_contiguous():
        raise ValueError(f"soft_embedding expects contiguous x [n, V] and weight [V, d], got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if torch.is_tensor(scale) and scale.device.type != "cpu":
        raise ValueError("soft_embedding's scale is a number or a CPU tensor (read on the "
                         f"host), got a tensor on {scale.device}")
    n, v = x.shape
    d = weight.shape[1]
    out = torch.empty((n, d), dtype=weight.dtype, device=x.device)
    if n == 0:
        return out
    cfg = config or soft_embedding_config(n, v, d)
    scale = float(torch.as_tensor(scale, dtype=torch.float32).to(weight.dtype))
    v_split = triton.cdiv(triton.cdiv(v, cfg.splits), cfg.block_v) * cfg.block_v
    splits = triton.cdiv(v, v_split)
    part = torch.empty((splits, n, d), dtype=torch.float32, device=x.device)
    stat = torch.empty((splits, n, 2), dtype=torch.float32, device=x.device)
    opts = pdl.launch_options(x)
    grid = (triton.cdiv(d, cfg.block_d), triton.cdiv(n, cfg.block_m), splits)
    _split_kernel[grid](x, weight, part, stat, n, v, d, v_split, BLOCK_M=cfg.block_m,
                        BLOCK_D=cfg.block_d, BLOCK_V=cfg.block_v,
                        PRECISION="ieee" if weight.dtype == torch.float32 else "tf32",
                        num_warps=cfg.warps, num_stages=cfg.stages, **opts)
    block = min(256, triton.next_power_of_2(d))
    _merge_kernel[(n, triton.cdiv(d, block))](part, stat, out, n, d, scale, SPLITS=splits,
                                              SPLITS_P2=triton.next_power_of_2(splits),
                                              BLOCK=block, num_warps=4, **opts)
    return out
