"""Reference attention backend: PyTorch scaled_dot_product_attention with an explicit mask.

Reads the lengths on the host (`.item()`), so it serves eager execution only (CPU and GPU). An
FP8 cache's keys and values are dequantised into q's dtype as they are gathered. Serves sliding
windows, layers of different head shapes and the chunk's K/V beside the cache
(`dlrt.attention.base`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlrt.attention.base import (
    CHUNK_KV,
    LAYER_SHAPES,
    SLIDING_WINDOW,
    AttentionBackend,
    ForwardMeta,
)
from dlrt.attention.kv_cache import PagedKVCache


def chunk_mask(n: int, start: int, kv_len: int, chunk_block: int | None,
               device, window: int | None = None) -> torch.Tensor | None:
    """Boolean mask [N, kv_len] (True = attend) for a chunk at `start`, or None when every
    key is visible to every query. `window` W: no key at or before p - W, p the query's
    position in a (block-)causal chunk and `start` in a full one (`dlrt.attention.base`)."""
    if chunk_block is None and window is None:
        return None
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(kv_len, device=device)[None, :]
    mask = torch.ones(n, kv_len, dtype=torch.bool, device=device)
    if chunk_block is not None:
        mask &= (j < start) | ((j - start) // chunk_block <= i // chunk_block)
    if window is not None:
        anchor = start + i if chunk_block is not None else start
        mask &= j > anchor - window
    return mask


class SDPABackend(AttentionBackend):
    """Gathers keys 0..kv_len-1 from the cache (dequantised when FP8; with `chunk_kv` keys
    0..start-1, then the chunk's), runs SDPA. Any device, dtype, head size and KV cache dtype,
    sliding windows, per-layer head shapes, the chunk's K/V beside the cache; eager only (not
    capturable).

    Raises:
        ValueError: chunk_kv with kv_len other than start + N.
    """

    name = "sdpa"
    serves = frozenset({SLIDING_WINDOW, LAYER_SHAPES, CHUNK_KV})

    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache, window: int | None = None,
                chunk_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        start, kv_len = (int(x) for x in meta.lens.tolist())
        if chunk_kv is None:
            keys, values = cache.read(layer, kv_len, q.dtype)  # [kv_len, Hkv, D]
        else:
            if kv_len != start + q.shape[0]:
                raise ValueError(f"chunk_kv: the chunk's {q.shape[0]} keys follow the "
                                 f"{start} cached ones (kv_len {start + q.shape[0]}); got "
                                 f"kv_len {kv_len}")
            cached = cache.read(layer, start, q.dtype)  # [start, Hkv, D] each
            keys, values = (torch.cat([c, t.to(q.dtype)])
                            for c, t in zip(cached, chunk_kv, strict=True))
        groups = q.shape[1] // keys.shape[1]
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        mask = chunk_mask(q.shape[0], start, kv_len, meta.chunk_block, q.device, window)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=mask, scale=scale,
        )  # [Hq, N, D]
        return out.transpose(0, 1)
