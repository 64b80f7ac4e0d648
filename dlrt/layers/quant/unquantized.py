"""Linear methods on unquantised (bf16/fp16/fp32) weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.layers.quant import LinearMethod

if TYPE_CHECKING:  # the kernels need Triton, which CPU-only installs may lack
    from dlrt.kernels.skinny_gemm import GemmConfig


class CublasLinear(LinearMethod):
    """`F.linear` (cuBLAS on CUDA): every shape, every row count."""

    name = "cublas"

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight)


class SkinnyGemmLinear(LinearMethod):
    """dlrt's weight-streaming Triton GEMM (`dlrt.kernels.skinny_gemm`) with `config` for up
    to `config.max_rows()` rows (16, or 4 for the GEMV); more rows (prefill) take `F.linear`."""

    name = "triton"

    def __init__(self, config: GemmConfig):
        self.config = config

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= self.config.max_rows():
            from dlrt.kernels.skinny_gemm import skinny_gemm

            return skinny_gemm(x.contiguous(), layer.weight, self.config)
        return F.linear(x, layer.weight)

    def __repr__(self) -> str:
        return f"SkinnyGemmLinear({self.config})"


CUBLAS = CublasLinear()
