"""Triton attention backend: `dlrt.kernels.paged_attention` over the paged cache.

Lengths (and an FP8 cache's per-layer scales) are read from device memory, so the backend works
inside captured CUDA graphs; on the CPU it runs under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import os

import torch

from dlrt.attention.base import AttentionBackend, ForwardMeta
from dlrt.attention.kv_cache import KV_FP8, PagedKVCache
from dlrt.kernels.paged_attention import default_splits, paged_chunk_attention, split_scratch


class TritonBackend(AttentionBackend):
    """`dlrt.kernels.paged_attention`: CUDA (or the CPU under TRITON_INTERPRET=1), any dtype and
    head size, a KV cache of the model dtype or FP8 (sm_89+); capturable. No sliding window and
    one head shape for every layer (`serves` nothing more)."""

    name = "triton"
    capturable = True

    @classmethod
    def supports(cls, device, dtype, execution_mode, head_dim=None, kv_cache_dtype=None,
                 needs=()):
        if kv_cache_dtype == KV_FP8 and device.type == "cuda" \
                and torch.cuda.get_device_capability(device) < (8, 9):
            return ("kv_cache_dtype='fp8' with attention backend 'triton' needs a GPU of "
                    "compute capability 8.9+ (FP8 loads); use kv_cache_dtype='auto'")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return ("attention backend 'triton' needs a CUDA device (on the CPU it runs only "
                    "in Triton's interpreter, TRITON_INTERPRET=1); use 'sdpa'")
        return super().supports(device, dtype, execution_mode, head_dim, kv_cache_dtype, needs)

    def __init__(self, cache: PagedKVCache, num_q_heads: int):
        super().__init__(cache, num_q_heads)
        # (capacity, n, Hq, Hkv, D, device) -> (context splits, their scratch buffers)
        self._plans: dict[tuple, tuple[int, tuple[torch.Tensor, torch.Tensor]]] = {}

    def plan(self, capacity: int, n: int, h_q: int, h_kv: int, d: int, device):
        """Context splits and split buffers for chunks of n tokens: chosen and allocated on
        first use (before capture), then reused by every launch of that shape."""
        key = (capacity, n, h_q, h_kv, d, device)
        if key not in self._plans:
            splits = default_splits(capacity, n, h_q, h_kv, device)
            self._plans[key] = splits, split_scratch(n, h_q, d, splits, device)
        return self._plans[key]

    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache) -> torch.Tensor:
        n, h_q, d = q.shape
        splits, scratch = self.plan(cache.capacity, n, h_q, cache.k.shape[-2], d, q.device)
        k_scale, v_scale = cache.scales(layer)  # FP8: 0-d views of the device scales
        return paged_chunk_attention(
            q.contiguous(), cache.k[layer], cache.v[layer], cache.page_table, meta.lens, scale,
            meta.chunk_block, max_kv=cache.capacity, splits=splits, scratch=scratch,
            k_scale=k_scale, v_scale=v_scale)
