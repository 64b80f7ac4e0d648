"""The Triton MoE method: the routing kernel and the fused routed experts
(`dlrt.kernels.moe_route`, `dlrt.kernels.moe`), with the numerics of `ReferenceMoE`.

Runs on CUDA and, under TRITON_INTERPRET=1, on the CPU. Every launch has fixed shapes and
reads its counts from device memory (capturable); the kernels' form (GEMV rows or grouped
GEMM tiles) is a function of the static shape only (`dlrt.kernels.moe.moe_config`).
FP8 experts are read as FP8 by the kernels (`dlrt.kernels.moe_fp8`; sm_89+ or the
interpreter): "fp8" experts in 128 x 128 block scales, held in block rows (`FP8_FORMAT`: I a
multiple of 128) or a row per weight row (`FP8_ROWS_FORMAT`: any I, e.g. DiffusionGemma's
704), and "compressed-tensors-fp8" experts with their per-channel scales; each touched
expert's FP8 bytes once per call, for every activation of `ACTIVATIONS`. Other quantised
experts keep a dequantising fallback: FP8 on a GPU before sm_89 and NVFP4 have no kernel of
their own; every call
dequantises all E experts into x's dtype (fixed shapes, still capturable; transient memory
of one layer's experts in that dtype) and runs the BF16 / fp32 kernels on them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from dlrt.kernels.activation import GATE_ACTIVATIONS
from dlrt.kernels.moe import MoEConfig, fused_experts, moe_config
from dlrt.kernels.moe_route import route_topk
from dlrt.layers.moe.base import MoEMethod


@functools.lru_cache(maxsize=16)
def _fp8_device(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 9)


# the formats whose experts the kernels read (e4m3 weights, fp32 scales in a layout of
# `dlrt.kernels.moe_fp8`), each with its scales' checkpoint suffix
FP8_EXPERTS = {"fp8": "weight_scale_inv", "compressed-tensors-fp8": "weight_scale"}


def fp8_blocks(experts) -> bool:
    """Whether the kernels read the experts as FP8: experts of a format of `FP8_EXPERTS`, on
    the CPU (the interpreter) or a GPU with FP8 support (sm_89+); else the dequantising
    fallback."""
    fmt = experts.quant_format
    if fmt is None or fmt.name not in FP8_EXPERTS:
        return False
    dev = experts.w13.device
    return dev.type != "cuda" or _fp8_device(dev.index if dev.index is not None
                                             else torch.cuda.current_device())


class TritonMoE(MoEMethod):
    """route: router logits (`Router.logits`: cuBLAS) -> one routing kernel (select: from
    given logits, with an optional per-expert scale); apply: align, gate-up, down, combine
    (see `dlrt.kernels.moe`), for experts of an activation in `ACTIVATIONS`.

    Args:
        config: (n, k, E, H, I) -> `MoEConfig`; default `moe_config` (override to tune).
    """

    name = "triton"
    ACTIVATIONS = GATE_ACTIVATIONS  # the experts' activations the kernels compute

    def __init__(self, config: Callable[[int, int, int, int, int], MoEConfig] = moe_config):
        self.config = config

    def route(self, layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights [N, k] fp32, ids [N, k] int64), as `reference.route`."""
        gate = layer.gate
        return self.select(layer.spec, gate.logits(x), gate.expert_bias)

    def select(self, spec, logits, expert_bias=None, expert_scale=None):
        """Router logits [N, E] -> (weights [N, k] fp32, ids [N, k] int64), as
        `ReferenceMoE.select`, in one kernel."""
        return route_topk(logits.contiguous(), spec.top_k, spec.scoring, expert_bias,
                          spec.renormalize, spec.n_group, spec.topk_group, spec.scaling,
                          expert_scale)

    def apply(self, layer, x: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor) -> torch.Tensor:
        """x [N, H], weights [N, k] fp32, ids [N, k] -> [N, H] in x's dtype.

        Raises:
            ValueError: experts of an activation the kernels do not compute (`moe_method`
                gives them the reference)."""
        ex = layer.experts
        act = ex.activation
        if act not in self.ACTIVATIONS:
            raise ValueError(f"the Triton MoE kernels compute experts of {self.ACTIVATIONS}, "
                             f"not {act!r}")
        cfg = self.config(x.shape[0], ids.shape[1], ex.num_experts, ex.hidden, ex.intermediate)
        fmt = ex.quant_format
        if fmt is None:
            return fused_experts(x, ex.w13, ex.w2, weights, ids, cfg, activation=act)
        if fp8_blocks(ex):
            scale = FP8_EXPERTS[fmt.name]
            return fused_experts(x, ex.w13, ex.w2, weights, ids, cfg,
                                 w13_scale=getattr(ex, f"w13_{scale}"),
                                 w2_scale=getattr(ex, f"w2_{scale}"), activation=act)
        return fused_experts(x, ex.expert_weight("w13", None, x.dtype),
                             ex.expert_weight("w2", None, x.dtype), weights, ids, cfg,
                             activation=act)
