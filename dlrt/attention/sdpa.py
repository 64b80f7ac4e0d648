"""Reference attention backend: PyTorch scaled_dot_product_attention with an explicit mask."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlrt.attention.backend import ForwardMeta
from dlrt.runtime.kv_cache import PagedKVCache


def chunk_mask(n: int, ctx_len: int, chunk_block: int | None, device) -> torch.Tensor | None:
    """Boolean mask [N, ctx_len + N] (True = attend), or None when every key is visible."""
    if chunk_block is None or chunk_block >= n:
        return None
    block = torch.arange(n, device=device) // chunk_block
    inner = block[None, :] <= block[:, None]  # [N, N]
    prefix = torch.ones(n, ctx_len, dtype=torch.bool, device=device)
    return torch.cat([prefix, inner], dim=1)


class SDPABackend:
    """Gathers the cached prefix, concatenates the chunk, runs SDPA (GQA by head repetition)."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: float, meta: ForwardMeta, cache: PagedKVCache | None) -> torch.Tensor:
        n = q.shape[0]
        if meta.ctx_len > 0:
            ck, cv = cache.read(layer, meta.ctx_len)
            keys, values = torch.cat([ck, k]), torch.cat([cv, v])
        else:
            keys, values = k, v
        if meta.write_len > 0:
            cache.write(layer, meta.ctx_len, k[: meta.write_len], v[: meta.write_len])
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        mask = chunk_mask(n, meta.ctx_len, meta.chunk_block, q.device)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=mask, scale=scale,
        )  # [Hq, N, D]
        return out.transpose(0, 1)
