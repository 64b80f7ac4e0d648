"""Whether the fused Triton kernels serve a forward (CUDA tensors, not disabled).

DLRT_FUSED_KERNELS=0 makes CUDA forwards take the unfused PyTorch reference ops (the baseline
of the kernel benchmarks). On the CPU the reference ops always run; the kernels themselves are
tested there under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch

from dlrt import env


def use_kernels(x: torch.Tensor) -> bool:
    return x.is_cuda and env.fused_kernels()
