"""What the MoE layer's parts share: the router's rule and the method interface."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RouterSpec:
    """How a token picks its experts (see the module docstring)."""

    scoring: str  # "softmax" | "sigmoid"
    num_experts: int
    top_k: int
    renormalize: bool = True
    n_group: int = 1
    topk_group: int = 1
    scaling: float = 1.0

    def __post_init__(self):
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"unknown router scoring {self.scoring!r}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} not in [1, {self.num_experts}]")
        if self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"n_group {self.n_group} / topk_group {self.topk_group} do not fit "
                             f"{self.num_experts} experts")
        if self.top_k > self.topk_group * (self.num_experts // self.n_group):
            raise ValueError(f"top_k {self.top_k} exceeds the experts of {self.topk_group} "
                             f"group(s)")


class MoEMethod:
    """How the routed experts are computed. `apply(layer, x [N, H], weights [N, k] fp32,
    ids [N, k] int64) -> [N, H]` in x's dtype: sum_j weights[:, j] * expert_{ids[:, j]}(x).
    `route(layer, x)` -> (weights [N, k] fp32, ids [N, k] int64): the layer's router (`gate`).
    `select(spec, logits [N, E], expert_bias=None, expert_scale=None)` -> the same from router
    logits a model computed itself: the rule of `spec` (`dlrt.layers.moe`), then, given
    `expert_scale` [E], each weight times its expert's scale (in fp32)."""

    name = "base"

    def route(self, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def select(self, spec: RouterSpec, logits: torch.Tensor,
               expert_bias: torch.Tensor | None = None,
               expert_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
