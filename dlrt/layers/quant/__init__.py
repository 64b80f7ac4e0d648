"""Linear methods: how a linear layer computes y = x @ W^T from the weights it holds, and the
quantised weight formats they read.

Every `Linear` / `MergedLinear` holds one `LinearMethod`, set at load from a plan
(`dlrt.tuning.linear`) or by quantisation (`dlrt.layers.quant.convert`): `unquantized` (cuBLAS,
or dlrt's skinny Triton GEMM for a few rows), `fp8` (128x128 block-scaled float8_e4m3fn),
`nvfp4` (e2m1 in groups of 16 with e4m3 group scales and a global fp32 scale). A method may own
weights besides `layer.weight` (scales).

A `QuantFormat` describes one quantised weight [n, k] twice: as the checkpoint stores it
(`stored`: per tensor suffix, the shape and dtype of one checkpoint tensor such as
`q_proj.weight_scale_inv`) and as a layer holds it (`held`). A held tensor has one row per
`row_block[suffix]` weight rows, so the parts of a merged projection or of an expert stack
concatenate along rows; `expand[suffix]` is the number of held rows per stored row (0: one
scalar for all rows). `for_parts` picks the variant that fits a module's parts (FP8: block
rows when every part boundary falls on a 128-row block, else one scale row per weight row).
"""

from __future__ import annotations

import torch
from torch import nn


class LinearMethod:
    """The interface. `name` is what reports show ("cublas", "triton", "fp8", ...);
    `quantized` methods read quantised weights, which load-time plans leave alone."""

    name = "base"
    quantized = False

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] with the layer's weight [N, K]."""
        raise NotImplementedError

    def takes_fp8(self, rows: int) -> bool:
        """Whether `apply` takes an input of `rows` rows as a `dlrt.ops.Fp8Activation` (FP8
        W8A8 methods); the model's producing op then returns one (`dlrt.layers.norm`)."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class QuantFormat:
    """One weight format (see the module docstring). Subclasses: `fp8.Fp8Format`,
    `nvfp4.Nvfp4Format`."""

    name = "base"
    suffixes: tuple[str, ...] = ("weight",)  # checkpoint tensors of one weight, weight first
    expand: dict[str, int] = {}
    row_block: dict[str, int] = {}  # weight rows per held row (1 when absent)

    def for_parts(self, parts: list[list[int]]) -> QuantFormat:
        """The variant for a module whose weights have these part sizes (rows, in order)."""
        return self

    def check(self, n: int, k: int) -> None:
        """Raise ValueError when a weight [n, k] cannot be held in this format."""

    def stored(self, suffix: str, n: int, k: int) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of checkpoint tensor `<module>.<suffix>` of a weight [n, k]."""
        raise NotImplementedError

    def held(self, suffix: str, n: int, k: int) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of the layer's tensor for `suffix`: first dimension n."""
        raise NotImplementedError

    def quantize(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """A weight [n, k] (any float dtype; computed in fp32) -> its stored tensors."""
        raise NotImplementedError

    def dequantize(self, held: dict[str, torch.Tensor], k: int,
                   dtype: torch.dtype) -> torch.Tensor:
        """Held tensors (leading dims allowed, e.g. experts) -> the weight [..., n, k] in
        `dtype`."""
        raise NotImplementedError

    def linear_method(self) -> LinearMethod:
        """The CPU-complete method of a linear layer holding this format."""
        raise NotImplementedError


def expand_rows(stored: torch.Tensor, expand: int, rows: int) -> torch.Tensor:
    """A stored tensor in the held layout: each row repeated `expand` times, the first `rows`
    kept (expand 1: as is; expand 0: a scalar, broadcast by the caller's copy)."""
    if expand == 0:
        return stored.reshape(())
    if expand == 1:
        return stored
    return stored.repeat_interleave(expand, dim=0)[:rows]
