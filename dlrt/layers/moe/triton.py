"""The Triton MoE method: the routing kernel and the fused routed experts
(`dlrt.kernels.moe_route`, `dlrt.kernels.moe`), with the numerics of `ReferenceMoE`.

Runs on CUDA and, under TRITON_INTERPRET=1, on the CPU. Every launch has fixed shapes and
reads its counts from device memory (capturable); the kernels' form (GEMV rows or grouped
GEMM tiles) is a function of the static shape only (`dlrt.kernels.moe.moe_config`).
Quantised experts (FP8, NVFP4) have no kernel of their own yet: every call dequantises all E
experts into x's dtype (fixed shapes, still capturable; transient memory of one layer's
experts in that dtype) and runs the same kernels on them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlrt.kernels.moe import MoEConfig, fused_experts, moe_config
from dlrt.kernels.moe_route import route_topk
from dlrt.layers.moe.base import MoEMethod


class TritonMoE(MoEMethod):
    """route: router logits (`Router.logits`: cuBLAS) -> one routing kernel; apply: align,
    gate-up, down, combine (see `dlrt.kernels.moe`).

    Args:
        config: (n, k, E, H, I) -> `MoEConfig`; default `moe_config` (override to tune).
    """

    name = "triton"

    def __init__(self, config: Callable[[int, int, int, int, int], MoEConfig] = moe_config):
        self.config = config

    def route(self, layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights [N, k] fp32, ids [N, k] int64), as `reference.route`."""
        spec, gate = layer.spec, layer.gate
        return route_topk(gate.logits(x).contiguous(), spec.top_k, spec.scoring,
                          gate.expert_bias, spec.renormalize, spec.n_group, spec.topk_group,
                          spec.scaling)

    def apply(self, layer, x: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor) -> torch.Tensor:
        """x [N, H], weights [N, k] fp32, ids [N, k] -> [N, H] in x's dtype."""
        ex = layer.experts
        cfg = self.config(x.shape[0], ids.shape[1], ex.num_experts, ex.hidden, ex.intermediate)
        if ex.quant_format is None:
            return fused_experts(x, ex.w13, ex.w2, weights, ids, cfg)
        return fused_experts(x, ex.expert_weight("w13", None, x.dtype),
                             ex.expert_weight("w2", None, x.dtype), weights, ids, cfg)
