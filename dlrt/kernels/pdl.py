"""Programmatic dependent launch (PDL, compute capability 9.0+) for the round's kernels.

A kernel launched with PDL may start while its predecessor in the stream is still running; it
must execute `griddepcontrol.wait` before it reads what the predecessor wrote (or writes what
the predecessor reads). The predecessor lets its dependent start early by executing
`griddepcontrol.launch_dependents`. Captured into a CUDA graph, the pair becomes a programmatic
edge, so launch latency, prologue and the tail of one kernel overlap the next.

Protocol used by every dlrt kernel launched with `launch_pdl`:
  - small kernels (norms, RoPE, activation, attention, sampling, split-K reductions) call
    `begin(PDL)` first: release the dependent, then wait for the predecessor;
  - the skinny GEMMs read nothing produced upstream before their wait except their weight (the
    GEMV loads its first weight tile before it waits); they release their dependent after the
    main loop, so the next kernel's launch overlaps the GEMM's tail, not its whole stream.
Every PDL kernel waits before it finishes, so completion stays transitive along the stream and
kernels launched without PDL (cuBLAS, PyTorch ops) see the usual full ordering.
Reference: CUDA Programming Guide, "Programmatic Dependent Launch and Synchronization"; PTX ISA
`griddepcontrol`.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tlcuda


@functools.cache
def _supported(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(t: torch.Tensor) -> bool:
    """Launch the kernels that touch `t` with PDL: a CUDA tensor on a 9.0+ device, not under
    TRITON_INTERPRET."""
    if not t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _supported(t.device.index if t.device.index is not None
                      else torch.cuda.current_device())


def launch_options(t: torch.Tensor) -> dict:
    """Keyword arguments of a Triton launch: the kernel's PDL constexpr and `launch_pdl`."""
    on = enabled(t)
    return {"PDL": on, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def begin(PDL: tl.constexpr):
    """Start of a small kernel: let the next kernel launch, then wait for the previous one."""
    if PDL:
        tlcuda.gdc_launch_dependents()
        tlcuda.gdc_wait()


@triton.jit
def wait(PDL: tl.constexpr):
    if PDL:
        tlcuda.gdc_wait()


@triton.jit
def release(PDL: tl.constexpr):
    if PDL:
        tlcuda.gdc_launch_dependents()
