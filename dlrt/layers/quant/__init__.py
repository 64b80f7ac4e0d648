"""Linear methods: how a linear layer computes y = x @ W^T from the weights it holds.

Every `Linear` / `MergedLinear` holds one `LinearMethod`, set at load from a plan
(`dlrt.tuning.linear`): `unquantized` (cuBLAS, or dlrt's skinny Triton GEMM for a few rows).
Quantised weights (FP8 block-scaled, NVFP4) and sharded linears for tensor parallelism are
further methods here; a method may own weights besides `layer.weight` (scales) and prepare them
after loading.
"""

from __future__ import annotations

import torch
from torch import nn


class LinearMethod:
    """The interface. `name` is what reports show ("cublas", "triton", ...)."""

    name = "base"

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] with the layer's weight [N, K]."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
