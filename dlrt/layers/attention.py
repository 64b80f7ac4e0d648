"""The attention layer: from the fused QKV projection to the attention output.

Per layer: split q/k/v, per-head q/k RMSNorm (SDAR, LLaDA2), RoPE (of all dims, or of the
first R: LLaDA2), K/V write into the paged cache (the ops table's `qk_norm_rope_write`: one
kernel with Triton; an FP8 cache is written with the layer's scales), then attention by the
forward's backend (with the layer's scale and sliding window, if any). The layer holds
per-layer constants; it names no kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrt.attention.base import ForwardContext
from dlrt.layers.norm import RMSNorm
from dlrt.layers.rotary import RotaryEmbedding
from dlrt.ops import Ops


class Attention(nn.Module):
    """qkv: [N, (Hq + 2 Hkv) * D] -> [N, Hq * D]; scale: D ** -0.5 unless given.

    cos/sin: [N, R/2] fp32 from `RotaryEmbedding.cos_sin` at the chunk's positions; the first
        R dims of each head are rotated (R < D: partial RoPE, LLaDA2).
    q_norm/k_norm: per-head RMSNorms over all D dims (SDAR, LLaDA2) or None (LLaDA).
    window: the layer's sliding window (`dlrt.attention.base`), None: none.
    A layer that prepares q, k and v itself (DiffusionGemma) calls `attend` instead.
    """

    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 ops: Ops, scale: float | None = None, window: int | None = None):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads "
                             f"{num_kv_heads}")
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.window = window
        self.ops = ops

    def forward(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                rotary: RotaryEmbedding, ctx: ForwardContext,
                q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None) -> torch.Tensor:
        layer, cache = self.layer_id, ctx.cache
        q = self.ops.qk_norm_rope_write(
            qkv, self.num_heads, self.num_kv_heads, self.head_dim,
            q_norm.weight if q_norm is not None else None,
            k_norm.weight if k_norm is not None else None,
            q_norm.eps if q_norm is not None else 0.0, cos, sin, ctx.meta.positions,
            cache.k[layer], cache.v[layer], cache.page_table, rotary.full_precision,
            *cache.scales(layer))
        out = ctx.attend(layer, q, self.scale, self.window)  # [N, Hq, D]
        return out.reshape(out.shape[0], -1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               ctx: ForwardContext, write: bool = True) -> torch.Tensor:
        """q [N, Hq, D], k, v [N, Hkv, D] (normed, RoPE applied, in the cache's dtype or the
        model's for an FP8 cache) -> [N, Hq * D]: k and v written into the cache at the
        chunk's positions (`PagedKVCache.write`), then attention by the forward's backend.
        write=False: nothing is written; the backend gets k and v beside the cache (in q's
        dtype; `dlrt.attention.base`, CHUNK_KV)."""
        if write:
            ctx.cache.write(self.layer_id, ctx.meta.positions, k, v)
            out = ctx.attend(self.layer_id, q, self.scale, self.window)  # [N, Hq, D]
        else:
            out = ctx.attend(self.layer_id, q, self.scale, self.window,
                             chunk_kv=(k.to(q.dtype), v.to(q.dtype)))
        return out.reshape(out.shape[0], -1)
