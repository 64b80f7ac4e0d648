"""Split-K partial sums of the weight-streaming GEMMs, and their reduction.

With SPLIT_K > 1 the K tiles of an output tile are dealt to SPLIT_K programs. Each writes its
fp32 partial sum to a scratch buffer `part` [SPLIT_K, BLOCK_M, N]; the sum over splits is
taken in split order 0, 1, ..., SPLIT_K - 1 starting from 0.0, so the result does not depend
on which program finishes first (deterministic, and bit-identical between the two ways below).

- "fused" (default): after storing its partial, a program increments its output tile's
  arrival counter (`tl.atomic_add`, acquire-release at GPU scope, after a CTA barrier so the
  whole tile's stores precede it). The program that arrives last reads the SPLIT_K partials
  (bypassing L1), writes y and sets the counter back to 0 for the next launch. No second
  kernel. The counters are one int32 per output tile in a per-device workspace (`counters`)
  shared by every GEMM on the device: kernels that use it must run in stream order (each
  launch leaves its counters at 0 when it ends; a dependent launch under PDL touches them only
  after its `griddepcontrol.wait`, that is after its predecessor has finished).
- "kernel": a second kernel (`_reduce_kernel`) adds the partials. Used when DLRT_SPLIT_K_REDUCE
  is "kernel", when the grid has more output tiles than the workspace holds counters, and when
  the workspace does not exist yet while a CUDA graph is being captured (it is never allocated
  inside a capture: the graph's pool would own it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt import env
from dlrt.kernels import pdl

COUNTERS = 1 << 14  # output tiles one fused launch may have (N <= 16384 * BLOCK_N)
_workspaces: dict[tuple[str, int | None], torch.Tensor] = {}


@triton.jit
def store_tile(acc, y_ptr, part_ptr, count_ptr, idx, ok, tile, split, part_stride,
               SPLIT_K: tl.constexpr, FUSED: tl.constexpr):
    """Store the fp32 tile acc of output tile `tile` and K split `split`: straight to y at
    SPLIT_K == 1; else to part (offset split * part_stride) and, FUSED, the last split of the
    tile to arrive sums all partials in split order into y. idx: the flat offsets m * N + n
    of acc's elements in y (any layout); ok: their mask."""
    if SPLIT_K == 1:
        tl.store(y_ptr + idx, acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(part_ptr + split * part_stride + idx, acc, mask=ok)
        if FUSED:
            tl.debug_barrier()  # every thread's stores before the arrival
            arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                total = tl.zeros_like(acc)
                for s in range(0, SPLIT_K):  # fixed order: deterministic
                    total += tl.load(part_ptr + s * part_stride + idx, mask=ok, other=0.0,
                                     cache_modifier=".cg")
                tl.store(y_ptr + idx, total.to(y_ptr.dtype.element_ty), mask=ok)
                tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")


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


def counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's arrival counters (int32 [COUNTERS], zeros between launches) when a launch
    with `tiles` output tiles may use them, else None (the reduction kernel serves it)."""
    if env.split_k_reduce() != "fused" or tiles > COUNTERS:
        return None
    key = (device.type, device.index)
    ws = _workspaces.get(key)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        ws = _workspaces[key] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return ws


def partials(y: torch.Tensor, split_k: int, block_m: int, tiles: int
             ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(part, counters, fused) for a launch writing y [M, N] with `tiles` output tiles: the
    fp32 scratch [split_k, block_m, N] (y itself at split_k == 1, unused), the counters (y when
    unused) and whether the kernel reduces in place."""
    if split_k == 1:
        return y, y, False
    part = torch.empty((split_k, block_m, y.shape[1]), dtype=torch.float32, device=y.device)
    count = counters(y.device, tiles)
    return part, (y if count is None else count), count is not None


def finish(part: torch.Tensor, y: torch.Tensor, split_k: int, block_m: int, fused: bool,
           opts: dict) -> torch.Tensor:
    """Run the reduction kernel when the GEMM did not reduce in place; returns y."""
    if split_k > 1 and not fused:
        m, n = y.shape
        block = 1024
        _reduce_kernel[(triton.cdiv(m * n, block),)](part, y, m, n, SPLIT_K=split_k,
                                                     BLOCK_M=block_m, BLOCK=block, **opts)
    return y
