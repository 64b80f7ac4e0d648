"""L2 prefetch of the next projection's weight, issued right after a projection (sm_90+).

At a few rows a round streams the weights, but between two projections the HBM idles: the
norms, RoPE, attention and activation that separate them read little, and the next GEMM needs
a few microseconds to ramp up its loads. `prefetch` launches, right after projection j and
with programmatic dependent launch (`dlrt.kernels.pdl`), a one-warp-per-program kernel that asks
the L2 for the first bytes of projection j+1's weight with the bulk prefetch
(`cp.async.bulk.prefetch.L2.global`, fire-and-forget) and ends; the small kernels that follow
run while the HBM fills the L2, and projection j+1 finds its first rows there. The weights are
constant, so the prefetch may run before the kernel waits for its predecessor; it changes no
value (a cache hint). Which weight follows which is set at load by `dlrt.layers.linear.plan`.
Reference: PTX ISA 8.0, "cp.async.bulk.prefetch"; CUDA Programming Guide, "L2 cache".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl

CHUNK_BYTES = 16384  # bytes one thread asks for (one bulk prefetch)
THREADS = 32  # one warp per program, one chunk per thread


@triton.jit
def _prefetch_kernel(w_ptr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, SIZE: tl.constexpr,
                     PDL: tl.constexpr):
    """Chunk i (elements [i * CHUNK, (i + 1) * CHUNK) of w, SIZE bytes) for i < CHUNKS, one per
    thread; the last program's spare threads repeat the last chunk (a hint: harmless)."""
    pdl.release(PDL)
    i = tl.minimum(tl.program_id(0) * 32 + tl.arange(0, 32), CHUNKS - 1)
    size = tl.full([32], SIZE, tl.int32)
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
        [w_ptr + i.to(tl.int64) * CHUNK, size], dtype=tl.int32, is_pure=False, pack=1)
    pdl.wait(PDL)


def chunks(w: torch.Tensor, nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Whole chunks of `chunk_bytes` in the first min(nbytes, size of w) bytes of w."""
    return min(nbytes, w.numel() * w.element_size()) // chunk_bytes


def supported(w: torch.Tensor) -> bool:
    """The bulk prefetch needs compute capability 9.0 and, to overlap the kernels around it,
    programmatic dependent launch: both are what `pdl.enabled` checks (a CUDA tensor on a
    9.0+ device, DLRT_PDL not '0', not interpreted)."""
    return pdl.enabled(w)


def prefetch(w: torch.Tensor, nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Ask the L2 for the first `nbytes` of w (rounded down to whole chunks); no-op where
    `supported(w)` is false or nothing is left after rounding.

    Args:
        w: a contiguous CUDA tensor (a projection weight), 16-byte aligned.
        nbytes: how many bytes from its start; capped at its size.
        chunk_bytes: bytes per bulk prefetch, a positive multiple of 16 and of w's element size.
    Raises:
        ValueError: w not contiguous or not 16-byte aligned, or a bad chunk size.
    """
    if chunk_bytes <= 0 or chunk_bytes % 16 or chunk_bytes % w.element_size():
        raise ValueError(f"l2 prefetch: chunk of {chunk_bytes} bytes is not a positive "
                         f"multiple of 16 and of {w.element_size()}")
    if not w.is_contiguous() or w.data_ptr() % 16:
        raise ValueError("l2 prefetch: the weight must be contiguous and 16-byte aligned")
    n = chunks(w, nbytes, chunk_bytes)
    if n == 0 or not supported(w):
        return
    _prefetch_kernel[(triton.cdiv(n, THREADS),)](
        w, CHUNK=chunk_bytes // w.element_size(), CHUNKS=n, SIZE=chunk_bytes, num_warps=1,
        **pdl.launch_options(w))
