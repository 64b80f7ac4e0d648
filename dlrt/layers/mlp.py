"""Gated feed-forward layers: SwiGLU, and `GatedMLP` of another activation (routed experts:
`dlrt.layers.moe`)."""

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.layers.linear import Linear, MergedLinear
from dlrt.layers.norm import feeds_fp8
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

    def forward(self, x) -> torch.Tensor:
        """x [N, H], or the `Fp8Activation` of it when `gate_up_proj` takes one."""
        return self.down_proj(silu_and_mul_for(self.ops, self.gate_up_proj(x), self.down_proj))


def silu_and_mul_for(ops: Ops, gate_up: torch.Tensor, consumer: nn.Module):
    """silu(gate) * up of gate_up [N, 2I] for `consumer` (the down projection): an
    `Fp8Activation` when its method takes one (`dlrt.layers.norm.feeds_fp8`), else [N, I]."""
    if feeds_fp8(consumer, gate_up):
        return ops.silu_and_mul_fp8(gate_up)
    return ops.silu_and_mul(gate_up)


# activation name (config.json's `hidden_act` / `hidden_activation`) -> function
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def gated(activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up, `activation` a name of `ACTIVATIONS`, in the inputs' dtype."""
    return ACTIVATIONS[activation](gate) * up


class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)); x: [N, H] -> [N, H]; `activation` a name of
    `ACTIVATIONS` (Gemma: "gelu_pytorch_tanh", transformers' tanh-approximated GELU).

    gate_proj and up_proj are one merged weight (`gate_up_proj`, one GEMM); the activation is
    plain PyTorch (the ops table has SiLU-and-mul only: use `SwiGLU` for SiLU)."""

    def __init__(self, hidden: int, intermediate: int, activation: str):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: one of {sorted(ACTIVATIONS)}")
        self.gate_up_proj = MergedLinear(hidden, {"gate_proj": intermediate,
                                                  "up_proj": intermediate})
        self.down_proj = Linear(intermediate, hidden)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(gated(self.activation, gate, up))
