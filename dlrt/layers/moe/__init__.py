"""The routed mixture-of-experts layer: a router, E stacked SwiGLU experts, an optional shared
expert, and a `MoEMethod` that computes the routed experts (chosen once at load).

Routers (`RouterSpec.scoring`):
  "softmax" (Qwen3-MoE / SDAR-MoE `Qwen3MoeSparseMoeBlock`): logits = x @ gate^T in x's dtype,
      softmax in fp32 over all E experts, top-k, renormalised to sum 1 when `renormalize`.
  "sigmoid" (LLaDA2 `LLaDA2MoeGate`): logits in fp32 (x and the gate weight in fp32), scores =
      sigmoid(logits); selection on scores + expert_bias (fp32) with group-limited top-k (the E
      experts in `n_group` groups, a group scored by the sum of its two best, the best
      `topk_group` groups kept); weights are the *unbiased* scores of the chosen experts,
      divided by (their sum + 1e-20) when top_k > 1 and `renormalize`, times `scaling`
      (`routed_scaling_factor`).
Ties in top-k go to the lower expert id (both the reference and the kernels).
"""

from __future__ import annotations

import torch
from torch import nn

from dlrt.layers.mlp import SwiGLU
from dlrt.layers.moe.base import MoEMethod, RouterSpec
from dlrt.ops import Ops


class Router(nn.Module):
    """The gate: weight [E, H] (checkpoint `<mlp>.gate.weight`), and for the sigmoid router an
    fp32 `expert_bias` [E] (`<mlp>.gate.expert_bias`). The sigmoid router keeps both in fp32
    (`fp32_params`: the loader materialises them in fp32)."""

    def __init__(self, hidden: int, spec: RouterSpec):
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden))
        if spec.scoring == "sigmoid":
            self.expert_bias = nn.Parameter(torch.empty(spec.num_experts))
            self.fp32_params = ("weight", "expert_bias")
        else:
            self.expert_bias = None
            self.fp32_params = ()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> router logits [N, E]: fp32 for the sigmoid router (computed in fp32),
        x's dtype for softmax (as the reference's `nn.Linear`)."""
        if self.spec.scoring == "sigmoid":
            return torch.nn.functional.linear(x.float(), self.weight)
        return torch.nn.functional.linear(x, self.weight)


class StackedExperts(nn.Module):
    """E gated experts (SwiGLU unless `activation` says another) stacked: w13 [E, 2I, H]
    (gate_proj rows, then up_proj rows) and
    w2 [E, H, I] (expert parallel: the rank's E experts, checkpoint ids from
    `first_expert`). Checkpoint tensors `<experts>.{e}.gate_proj.weight` fill w13[e, :I],
    `up_proj` w13[e, I:], `down_proj` w2[e] (`checkpoint_parts`).

    Quantised experts (`dlrt.layers.quant.convert`) hold w13 / w2 in their format, with the
    format's other tensors beside them (e.g. FP8 `w13_weight_scale_inv` [E, ceil(2I/128),
    ceil(H/128)] in block rows, or [E, 2I, ceil(H/128)] when I is not a multiple of 128);
    `expert_weight` dequantises. The Triton method reads FP8 experts directly in either
    layout, and compressed-tensors FP8 ones with their per-channel scales
    (`dlrt.kernels.moe_fp8`); every other case reads them through `expert_weight`."""

    quant_format = None  # a `QuantFormat` once converted

    # the checkpoint tensor of each weight when `stacked` (transformers' fused experts)
    STACKED = {"w13": "gate_up_proj", "w2": "down_proj"}

    def __init__(self, num_experts: int, hidden: int, intermediate: int,
                 activation: str = "silu", stacked: bool = False):
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.first_expert = 0  # checkpoint id of expert 0 here (expert parallel: the rank's)
        self.total_experts = num_experts  # the layer's experts over every rank
        self.activation = activation  # of the gate rows (`dlrt.layers.mlp.ACTIVATIONS`)
        # stacked: the checkpoint holds `<experts>.gate_up_proj` [E, 2I, H] (gate rows first)
        # and `<experts>.down_proj` [E, H, I] (Gemma 4, DiffusionGemma) instead of one tensor
        # per expert and part (`checkpoint_parts`)
        self.stacked = stacked
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def checkpoint_parts(self, param: str) -> list[tuple[str, slice]]:
        """(checkpoint sub-name of expert e, rows of the expert's slice) filling `param`."""
        i = self.intermediate
        if param == "w13":
            return [("gate_proj.weight", slice(0, i)), ("up_proj.weight", slice(i, 2 * i))]
        return [("down_proj.weight", slice(0, self.hidden))]

    def expert_weight(self, param: str, ids: torch.Tensor | int | None,
                      dtype: torch.dtype) -> torch.Tensor:
        """`param` ("w13" or "w2") of experts `ids` (an int, an index tensor, or None for
        all) in `dtype`: [2I, H] / [H, I] per expert, with ids' leading dims. Quantised
        experts are dequantised here, for the call only."""
        fmt = self.quant_format
        if fmt is None:
            w = getattr(self, param)
            return (w if ids is None else w[ids]).to(dtype)
        held = {}
        for name, (weight, suffix) in self.quant_params.items():
            if weight == param:
                t = getattr(self, name)
                held[suffix] = t if ids is None else t[ids]
        return fmt.dequantize(held, self.quant_cols[param], dtype)


class FusedMoE(nn.Module):
    """Routed experts plus an optional shared expert; x [N, H] -> [N, H] in x's dtype.

    Submodule names follow the checkpoints: `gate` (router), `experts`, `shared_experts`
    (LLaDA2: a SwiGLU of `shared_intermediate` = moe_intermediate_size * num_shared_experts).
    The method is the ops table's (`moe_method(ops)`): the PyTorch reference, or the Triton
    kernels on CUDA (or under TRITON_INTERPRET=1).
    """

    def __init__(self, hidden: int, intermediate: int, spec: RouterSpec, ops: Ops,
                 shared_intermediate: int = 0):
        super().__init__()
        self.spec = spec
        self.gate = Router(hidden, spec)
        self.experts = StackedExperts(spec.num_experts, hidden, intermediate)
        self.shared_experts = (SwiGLU(hidden, shared_intermediate, ops)
                               if shared_intermediate else None)
        self.method: MoEMethod = moe_method(ops)
        self.reduce = None  # expert parallel: the ranks' all-reduce of the partial output


    def route_and_apply(self, x: torch.Tensor) -> torch.Tensor:
        """The routed experts' sum for x [N, H] (router, assignment, experts, combine)."""
        weights, ids = self.method.route(self, x)
        return self.method.apply(self, x, weights, ids)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.route_and_apply(x)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y if self.reduce is None else self.reduce(y)

    def extra_repr(self) -> str:
        s = self.spec
        return f"experts={s.num_experts}, top_k={s.top_k}, router={s.scoring}, " \
               f"method={self.method.name}"


def moe_method(ops: Ops, activation: str = "silu") -> MoEMethod:
    """The MoE method of an ops table: "reference" -> PyTorch, "triton" -> the Triton kernels
    (SiLU and gelu_pytorch_tanh experts, `TritonMoE.ACTIVATIONS`; experts of another
    `activation` take the PyTorch reference)."""
    if ops.name == "triton":
        from dlrt.layers.moe.triton import TritonMoE
        if activation in TritonMoE.ACTIVATIONS:
            return TritonMoE()
    from dlrt.layers.moe.reference import ReferenceMoE
    return ReferenceMoE()
