"""L2 prefetch of the next projection's weight, issued right after a projection (sm_90+).

At a few rows a round streams the weights, but between two projections the HBM idles: the
norms, RoPE, attention and activation that separate them read little, and the next GEMM needs
a few microseconds to ramp up its loads. `prefetch` launches, right after projection j and
with programmatic dependent launch (`dlrt.kernels.pdl`), a kernel whose threads each ask the L2
for a few 128-byte lines of the first bytes of projection j+1's weight
(`prefetch.global.L2::evict_last`: fire-and-forget, kept ahead of the streamed lines) and
ends; the small kernels that follow run while the HBM fills the L2, and projection j+1 finds
its first rows there. The weights are constant, so the prefetch may run before the kernel waits
for its predecessor; it changes no value (a cache hint). Which weight follows which is set at
load by `dlrt.layers.linear.plan`. (The bulk form, `cp.async.bulk.prefetch.L2`, was measured
slower on the H200: `benchmarks/results/prefetch-probe-run1-20261130.json`.)
Reference: PTX ISA, "prefetch, prefetchu" (eviction priority, sm_80+); CUDA Programming Guide,
"L2 cache".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl

LINE = 128  # bytes per prefetched line
BLOCK = 1024  # lines per program: 8 warps, 4 lines per thread
WARPS = 8


@triton.jit
def _prefetch_kernel(w_ptr, lines, LINE_ELEMS: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    """Line i (w[i * LINE_ELEMS]) for i < lines; the last program's spare lanes repeat the
    last line (a hint: harmless)."""
    pdl.release(PDL)
    i = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), lines - 1)
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
        [w_ptr + i.to(tl.int64) * LINE_ELEMS], dtype=tl.int32, is_pure=False, pack=1)
    pdl.wait(PDL)


def lines(w: torch.Tensor, nbytes: int) -> int:
    """Whole 128-byte lines in the first min(nbytes, size of w) bytes of w."""
    return min(nbytes, w.numel() * w.element_size()) // LINE


def supported(w: torch.Tensor) -> bool:
    """The prefetch overlaps the kernels around it only under programmatic dependent launch:
    what `pdl.enabled` checks (a CUDA tensor on a 9.0+ device, DLRT_PDL not '0', not
    interpreted)."""
    return pdl.enabled(w)


def prefetch(w: torch.Tensor, nbytes: int) -> None:
    """Ask the L2 for the first `nbytes` of w (whole lines); no-op where `supported(w)` is
    false or no whole line is asked for.

    Args:
        w: a contiguous tensor (a projection weight).
        nbytes: how many bytes from its start; capped at its size.
    Raises:
        ValueError: w not contiguous.
    """
    if not w.is_contiguous():
        raise ValueError(f"l2 prefetch: the weight must be contiguous, got shape "
                         f"{tuple(w.shape)} with strides {w.stride()}")
    n = lines(w, nbytes)
    if n == 0 or not supported(w):
        return
    _prefetch_kernel[(triton.cdiv(n, BLOCK),)](
        w, n, LINE_ELEMS=LINE // w.element_size(), BLOCK=BLOCK, num_warps=WARPS,
        **pdl.launch_options(w))
