"""Triton attention backend: `dlrt.kernels.paged_attention` over the paged cache.

Lengths (and an FP8 cache's per-layer scales) are read from device memory, so the backend works
inside captured CUDA graphs; on the CPU it runs under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import os

import torch

from dlrt.attention.base import (
    CHUNK_KV,
    LAYER_SHAPES,
    SLIDING_WINDOW,
    AttentionBackend,
    ForwardMeta,
)
from dlrt.attention.kv_cache import KV_FP8, PagedKVCache
from dlrt.kernels.paged_attention import default_splits, paged_chunk_attention, split_scratch


class TritonBackend(AttentionBackend):
    """`dlrt.kernels.paged_attention`: CUDA (or the CPU under TRITON_INTERPRET=1), any dtype,
    head sizes 16..512 (powers of two), a KV cache of the model dtype or FP8 (sm_89+);
    capturable. Serves sliding windows, per-layer head shapes and the chunk's K/V beside the
    cache (DiffusionGemma), the last not with an FP8 cache."""

    name = "triton"
    capturable = True
    serves = frozenset({SLIDING_WINDOW, LAYER_SHAPES, CHUNK_KV})

    @classmethod
    def supports(cls, device, dtype, execution_mode, head_dim=None, kv_cache_dtype=None,
                 needs=()):
        if kv_cache_dtype == KV_FP8 and CHUNK_KV in needs:
            return ("kv_cache_dtype='fp8' with attention backend 'triton' is not served for a "
                    "model whose decoder writes nothing to the cache (its chunk's K/V, in the "
                    "model dtype, would sit beside an FP8 prefix); use kv_cache_dtype='auto', "
                    "or attention backend 'sdpa'")
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
        # (capacity, n, Hq, Hkv, D, window, device) -> (context splits, their scratch buffers)
        self._plans: dict[tuple, tuple[int, tuple[torch.Tensor, torch.Tensor]]] = {}

    @staticmethod
    def context_keys(capacity: int, n: int, window: int | None) -> int:
        """The most keys a chunk of n queries reads: the capacity, or W - 1 + n with a window
        (the context starts at start - W + 1)."""
        return capacity if window is None else min(capacity, window - 1 + n)

    def plan(self, capacity: int, n: int, h_q: int, h_kv: int, d: int, device,
             window: int | None = None):
        """Context splits and split buffers for chunks of n tokens: chosen and allocated on
        first use (before capture), then reused by every launch of that shape."""
        key = (capacity, n, h_q, h_kv, d, window, device)
        if key not in self._plans:
            keys = self.context_keys(capacity, n, window)
            splits = default_splits(keys, n, h_q, h_kv, device, d)
            self._plans[key] = splits, split_scratch(n, h_q, d, splits, device)
        return self._plans[key]

    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache, window: int | None = None,
                chunk_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        n, h_q, d = q.shape
        k_cache, v_cache = cache.k[layer], cache.v[layer]  # [pages, page, Hkv, D]
        splits, scratch = self.plan(cache.capacity, n, h_q, k_cache.shape[-2], d, q.device,
                                    window)
        k_scale, v_scale = cache.scales(layer)  # FP8: 0-d views of the device scales
        if chunk_kv is not None:
            chunk_kv = (chunk_kv[0].contiguous(), chunk_kv[1].contiguous())
        return paged_chunk_attention(
            q.contiguous(), k_cache, v_cache, cache.page_table, meta.lens, scale,
            meta.chunk_block, max_kv=self.context_keys(cache.capacity, n, window),
            splits=splits, scratch=scratch, k_scale=k_scale, v_scale=v_scale, window=window,
            chunk_kv=chunk_kv)
