"""Greedy candidates from logits in one pass: argmax and its softmax probability per row.

For temperature 0 the round needs, per position, the argmax token and its probability
max softmax = 1 / sum_v exp(l_v - max l). Computing both from the logits in one pass avoids the
fp32 [n, V] probabilities. Two stages: each program reduces one slice of the vocabulary of one
row to (max, first argmax, sum exp(l - max)); a second kernel merges the slices. Ties pick the
lowest token id, as `torch.max(dim)` does. A token id to exclude (the mask token; a runtime
argument, not a constexpr) reads as -inf. A NaN or +inf logit makes its row's probability NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl


@triton.jit
def _slice_kernel(logits_ptr, part_ptr, part_idx_ptr, V, exclude, SLICE: tl.constexpr,
                  BLOCK: tl.constexpr, SLICES: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    idx = tl.zeros([BLOCK], tl.int32)
    for t in range(0, SLICE // BLOCK):
        v = sl * SLICE + t * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * V + v, mask=v < V, other=float("-inf")).to(tl.float32)
        x = tl.where(v == exclude, float("-inf"), x)
        better = x > m  # strict: the earlier index wins ties
        idx = tl.where(better, v, idx)
        m = tl.where(better, x, m)
    m_all = tl.max(m, axis=0)
    first = tl.min(tl.where(m == m_all, idx, 2147483647), axis=0)
    # sum of exp over the slice, relative to the slice max
    s = tl.zeros([BLOCK], tl.float32)
    for t in range(0, SLICE // BLOCK):
        v = sl * SLICE + t * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * V + v, mask=v < V, other=float("-inf")).to(tl.float32)
        x = tl.where(v == exclude, float("-inf"), x)
        # NOTE: -inf adds nothing (an all -inf slice sums to 0); NaN and +inf make the sum NaN
        s += tl.where((v < V) & (x != float("-inf")), tl.exp(x - m_all), 0.0)
    out = row * SLICES + sl
    tl.store(part_ptr + out * 2, m_all)
    tl.store(part_ptr + out * 2 + 1, tl.sum(s, axis=0))
    tl.store(part_idx_ptr + out, first)


@triton.jit
def _merge_kernel(part_ptr, part_idx_ptr, ids_ptr, conf_ptr, SLICES: tl.constexpr,
                  PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, SLICES)
    m = tl.load(part_ptr + (row * SLICES + k) * 2)
    s = tl.load(part_ptr + (row * SLICES + k) * 2 + 1)
    idx = tl.load(part_idx_ptr + row * SLICES + k)
    m_all = tl.max(m, axis=0)
    best = tl.min(tl.where(m == m_all, idx, 2147483647), axis=0)
    total = tl.sum(tl.where(s != 0, s * tl.exp(m - m_all), 0.0), axis=0)  # NaN propagates
    tl.store(ids_ptr + row, best.to(tl.int64))
    tl.store(conf_ptr + row, 1.0 / total)


def greedy_candidates(logits: torch.Tensor, exclude: int = -1
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax ids [n] int64, max softmax probability [n] fp32) of logits [n, V] (contiguous,
    any float dtype; softmax in fp32), the token `exclude` (the mask token; -1: none) read as
    -inf. A row with a NaN or +inf logit gets a NaN probability."""
    if logits.dim() != 2 or not logits.is_contiguous():
        raise ValueError(f"greedy_candidates expects contiguous [n, V] logits, got "
                         f"{tuple(logits.shape)}")
    n, v = logits.shape
    opts = pdl.launch_options(logits)
    block = 1024
    slices = min(32, triton.next_power_of_2(triton.cdiv(v, block)))
    slice_len = triton.cdiv(triton.cdiv(v, slices), block) * block
    part = torch.empty(n * slices * 2, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(n * slices, dtype=torch.int32, device=logits.device)
    ids = torch.empty(n, dtype=torch.int64, device=logits.device)
    conf = torch.empty(n, dtype=torch.float32, device=logits.device)
    _slice_kernel[(n, slices)](logits, part, part_idx, v, exclude, SLICE=slice_len, BLOCK=block,
                               SLICES=slices, num_warps=4, **opts)
    _merge_kernel[(n,)](part, part_idx, ids, conf, SLICES=slices, num_warps=1, **opts)
    return ids, conf
