"""Paged KV cache for one request.

Layout (FlashInfer's NHD paged layout): k, v: [L, num_pages, page_size, Hkv, D]. Token t of the
request lives in page `page_table[t // page_size]`, slot `t % page_size`. One request owns the
cache, so the page table is the identity; it is still honoured on every read and write so
kernels that take a page table see the same layout. Which positions hold committed K/V is the
decoder's bookkeeping: a forward writes its whole chunk, committed or not.
"""

from __future__ import annotations

import torch

from dlrt.ops.reference import paged_slots, paged_write


class PagedKVCache:
    """K/V of one request.

    Args:
        num_layers, num_kv_heads, head_dim: model shape.
        max_tokens: capacity in tokens (rounded up to whole pages).
        page_size: tokens per page.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_tokens: int,
                 dtype: torch.dtype, device: torch.device | str, page_size: int = 16):
        self.page_size = page_size
        self.num_pages = -(-max_tokens // page_size)
        self.capacity = self.num_pages * page_size
        shape = (num_layers, self.num_pages, page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.page_table = torch.arange(self.num_pages, dtype=torch.int32, device=device)

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """Flat slot index [n] int64 of each position [n]."""
        return paged_slots(self.page_table, self.page_size, positions)

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write k, v: [n, Hkv, D] of the tokens at `positions` [n] (no host sync)."""
        paged_write(self.k[layer], self.v[layer], self.page_table, positions, k, v)

    def read(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `length` tokens' k, v of layer `layer`: [length, Hkv, D] each."""
        slots = self.slots(torch.arange(length, device=self.page_table.device))
        k = self.k[layer].view(-1, *self.k.shape[-2:])
        v = self.v[layer].view(-1, *self.v.shape[-2:])
        return k[slots], v[slots]
