"""The PyTorch reference of the MoE layer: routers and the routed experts (every kernel's
reference; the CPU path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlrt.layers.mlp import gated
from dlrt.layers.moe.base import MoEMethod, RouterSpec


def _topk_low_index(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk with ties to the lower index: a stable descending sort."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return scores.gather(-1, order), order


def route(spec: RouterSpec, logits: torch.Tensor, expert_bias: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> (weights [N, k] fp32, expert ids [N, k] int64); see
    `dlrt.layers.moe` for the two rules."""
    k = spec.top_k
    if spec.scoring == "softmax":
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = _topk_low_index(probs, k)
        if spec.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids
    scores = torch.sigmoid(logits.float())
    biased = scores + expert_bias.float() if expert_bias is not None else scores
    n, e = biased.shape
    if spec.n_group > 1:
        grouped = biased.view(n, spec.n_group, e // spec.n_group)
        group_score = _topk_low_index(grouped, 2)[0].sum(-1) if grouped.shape[-1] > 1 \
            else grouped[..., 0]
        keep = _topk_low_index(group_score, spec.topk_group)[1]  # [N, topk_group]
        group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
        allowed = group_mask[:, :, None].expand_as(grouped).reshape(n, e)
        biased = biased.masked_fill(~allowed, float("-inf"))
    ids = _topk_low_index(biased, k)[1]
    weights = scores.gather(1, ids)
    if k > 1 and spec.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * spec.scaling, ids


class ReferenceMoE(MoEMethod):
    """Routed experts in PyTorch: up to `GATHER_PAIRS_PER_EXPERT * E` (token, expert) pairs
    gather their experts' weights (fixed shapes, no host sync, capturable); more pairs loop over
    the chosen experts (a host sync: prefill only). The choice depends on shapes only. The
    gate rows take the experts' `activation` (SiLU unless a family says otherwise). Each
    expert output is in x's dtype, weighted and summed in fp32, then cast. Quantised experts
    (FP8, NVFP4) are dequantised into x's dtype as they are read (the gathered or chosen
    experts only: `StackedExperts.expert_weight`)."""

    name = "reference"
    GATHER_PAIRS_PER_EXPERT = 4

    def route(self, layer, x):
        gate = layer.gate
        return route(layer.spec, gate.logits(x), gate.expert_bias)

    def select(self, spec, logits, expert_bias=None, expert_scale=None):
        weights, ids = route(spec, logits, expert_bias)
        return (weights, ids) if expert_scale is None else (weights * expert_scale[ids], ids)

    def apply(self, layer, x, weights, ids):
        n, k = ids.shape
        ex = layer.experts
        i, act = ex.intermediate, ex.activation
        if n * k <= self.GATHER_PAIRS_PER_EXPERT * ex.num_experts:
            flat = ids.reshape(-1)  # [N*k]
            xs = x.repeat_interleave(k, dim=0)[:, :, None]  # [N*k, H, 1]
            w13, w2 = ex.expert_weight("w13", flat, x.dtype), ex.expert_weight("w2", flat, x.dtype)
            gu = torch.bmm(w13, xs)[:, :, 0]  # [N*k, 2I]
            y = torch.bmm(w2, gated(act, gu[:, :i], gu[:, i:])[:, :, None])[:, :, 0]
            return (y.view(n, k, -1).float() * weights[:, :, None]).sum(dim=1).to(x.dtype)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for expert in torch.unique(ids).tolist():
            rows, slot = torch.nonzero(ids == expert, as_tuple=True)
            gu = F.linear(x[rows], ex.expert_weight("w13", expert, x.dtype))
            y = F.linear(gated(act, gu[:, :i], gu[:, i:]), ex.expert_weight("w2", expert, x.dtype))
            out.index_add_(0, rows, y.float() * weights[rows, slot, None])
        return out.to(x.dtype)
