"""Triton attention backend: `dlrt.kernels.paged_attention` over the paged cache.

Lengths are read from device memory, so the backend works inside captured CUDA graphs; on the
CPU it runs under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import torch

from dlrt.attention.backend import ForwardMeta
from dlrt.kernels.paged_attention import default_splits, paged_chunk_attention, split_scratch
from dlrt.runtime.kv_cache import PagedKVCache


class TritonBackend:
    def __init__(self):
        self._scratch: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._splits: dict[tuple, int] = {}

    def scratch(self, n: int, h_q: int, d: int, splits: int, device):
        """Split buffers for chunks of n tokens; allocated on first use (before capture)."""
        key = (n, h_q, d, splits, str(device))
        if key not in self._scratch:
            self._scratch[key] = split_scratch(n, h_q, d, splits, device)
        return self._scratch[key]

    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache) -> torch.Tensor:
        n, h_q, d = q.shape
        key = (cache.capacity, n, h_q, cache.k.shape[-2], q.device)
        splits = self._splits.get(key)
        if splits is None:  # a device query: once per shape, not per launch
            splits = self._splits[key] = default_splits(*key)
        return paged_chunk_attention(
            q.contiguous(), cache.k[layer], cache.v[layer], cache.page_table, meta.lens, scale,
            meta.chunk_block, max_kv=cache.capacity, splits=splits,
            scratch=self.scratch(n, h_q, d, splits, q.device))
