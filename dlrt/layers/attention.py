"""The thin attention layer: per-layer constants, the work goes to the forward's backend."""

import torch
from torch import nn

from dlrt.attention import ForwardContext


class Attention(nn.Module):
    """Scaled dot-product attention of one layer over the KV cache plus the current chunk.

    q: [N, Hq, D], k/v: [N, Hkv, D] with RoPE applied -> [N, Hq * D]. scale = D ** -0.5.
    """

    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads "
                             f"{num_kv_heads}")
        self.layer_id = layer_id
        self.scale = head_dim**-0.5

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: ForwardContext) -> torch.Tensor:
        out = ctx.attend(self.layer_id, q, k, v, self.scale)  # [N, Hq, D]
        return out.reshape(out.shape[0], -1)
