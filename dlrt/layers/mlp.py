"""The SwiGLU feed-forward layer (routed experts: `dlrt.layers.moe`)."""

import torch
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
