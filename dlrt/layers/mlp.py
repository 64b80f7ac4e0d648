"""Feed-forward layers: SwiGLU MLP and a top-k routed mixture of SwiGLU experts (Qwen3-MoE)."""

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.layers.linear import Linear, MergedLinear
from dlrt.ops import Ops


class SwiGLU(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)); x: [N, H] -> [N, H].

    gate_proj and up_proj are one merged weight (`gate_up_proj`, one GEMM); SiLU-and-mul is
    the ops table's (one kernel with Triton)."""

    def __init__(self, hidden: int, intermediate: int, ops: Ops):
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden, {"gate_proj": intermediate,
                                                  "up_proj": intermediate})
        self.down_proj = Linear(intermediate, hidden)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class Experts(nn.Module):
    """E SwiGLU experts stacked: gate_proj/up_proj [E, I, H], down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate, hidden))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))


class SparseMoE(nn.Module):
    """Qwen3-MoE block: router softmax in fp32 over all experts, top-k, renormalised when
    `norm_topk_prob`, no shared expert. x: [N, H] -> [N, H].

    Up to `GATHER_PAIRS_PER_EXPERT * E` (token, expert) pairs gather their experts' weights
    (fixed shapes, no host sync: the path of every denoising round, captured or not); more
    pairs (long prefills) loop over the experts that were chosen. The choice depends on shapes
    only, so eager and captured rounds compute the same way.
    """

    GATHER_PAIRS_PER_EXPERT = 4

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool):
        super().__init__()
        self.gate = Linear(hidden, num_experts)
        self.experts = Experts(num_experts, hidden, intermediate)
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (weights [N, k] in x.dtype, expert ids [N, k] int64)."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [N, E] fp32
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        n, k = ids.shape
        e = self.experts
        if n * k <= self.GATHER_PAIRS_PER_EXPERT * e.gate_proj.shape[0]:
            flat = ids.reshape(-1)  # [N*k]
            xs = x.repeat_interleave(k, dim=0)[:, :, None]  # [N*k, H, 1]
            g = torch.bmm(e.gate_proj[flat], xs)  # [N*k, I, 1]
            u = torch.bmm(e.up_proj[flat], xs)
            y = torch.bmm(e.down_proj[flat], F.silu(g) * u)[:, :, 0]  # [N*k, H]
            return (y.view(n, k, -1) * weights[:, :, None]).sum(dim=1)
        out = torch.zeros_like(x)
        for expert in torch.unique(ids).tolist():
            rows, slot = torch.nonzero(ids == expert, as_tuple=True)
            h = x[rows]
            y = F.linear(F.silu(F.linear(h, e.gate_proj[expert])) * F.linear(h, e.up_proj[expert]),
                         e.down_proj[expert])
            out.index_add_(0, rows, y * weights[rows, slot, None])
        return out
