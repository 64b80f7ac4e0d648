"""Paged KV cache for one request.

Layout (FlashInfer's NHD paged layout): k, v: [L, num_pages, page_size, Hkv, D]; a model whose
layers differ in head size or KV heads (DiffusionGemma) gets one [num_pages, page_size, Hkv_l,
D_l] tensor per layer instead (k, v: tuples; `k[layer]` is one layer's either way). Token t of the
request lives in page `page_table[t // page_size]`, slot `t % page_size`. One request owns the
cache, so the page table is the identity; it is still honoured on every read and write so
kernels that take a page table see the same layout. Which positions hold committed K/V is the
decoder's bookkeeping: a forward writes its whole chunk, committed or not.

The cache holds the model dtype, or FP8 (float8_e4m3fn, `kv_cache_dtype="fp8"`): K and V of
layer l stored as x / k_scale[l] and x / v_scale[l] (clamped to +-448, rounded to nearest
even) and read as stored * scale (`dlrt.ops.reference.quantize_kv` / `dequantize_kv`). The
scales are fp32 tensors on the device, so captured graphs read them from memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlrt.ops.reference import KV_FP8, dequantize_kv, paged_slots, paged_write


def _scale_vector(values: torch.Tensor | None, num_layers: int, device) -> torch.Tensor:
    """[L] fp32 on `device` (ones when `values` is None).

    NOTE: each layer's scale starts a 16-byte row (a strided view of [L, 4]): Triton
    specialises pointer arguments on 16-byte alignment, so every layer's scale pointer takes
    the same compiled kernel."""
    rows = torch.zeros(num_layers, 4, dtype=torch.float32, device=device)
    rows[:, 0] = 1.0 if values is None else values.to(device, torch.float32).reshape(num_layers)
    return rows[:, 0]


class PagedKVCache:
    """K/V of one request.

    Args:
        num_layers, num_kv_heads, head_dim: model shape.
        max_tokens: capacity in tokens (rounded up to whole pages).
        dtype: what the cache stores: the model dtype, or torch.float8_e4m3fn (FP8).
        device: where it lives. page_size: tokens per page.
        k_scale, v_scale: FP8 only: [L] per-layer scales (K and V are stored divided by them);
            default 1.0.
        layer_shapes: (Hkv, D) of each layer, when layers differ (`ModelConfig.kv_shapes`);
            None: every layer (num_kv_heads, head_dim).
    Raises:
        ValueError: scales for a cache that is not FP8, or not one per layer; layer_shapes not
            one per layer.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_tokens: int,
                 dtype: torch.dtype, device: torch.device | str, page_size: int = 16,
                 k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                 layer_shapes: Sequence[tuple[int, int]] | None = None):
        self.page_size = page_size
        self.num_pages = -(-max_tokens // page_size)
        self.capacity = self.num_pages * page_size
        self.dtype = dtype
        shapes = [(num_kv_heads, head_dim)] * num_layers if layer_shapes is None \
            else [tuple(s) for s in layer_shapes]
        if len(shapes) != num_layers:
            raise ValueError(f"layer_shapes: one (Hkv, D) per layer ({num_layers}); got "
                             f"{len(shapes)}")
        self.layer_shapes = tuple(shapes)
        self._allocate(device)
        self.page_table = torch.arange(self.num_pages, dtype=torch.int32, device=device)
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None and (not self.quantized or s.numel() != num_layers):
                raise ValueError(f"{name}: one scale per layer ({num_layers}) and only for an "
                                 f"FP8 cache; got {tuple(s.shape)} for {dtype}")
        # k_scale, v_scale: [L] fp32 on the device (read only by an FP8 cache)
        self.k_scale = _scale_vector(k_scale, num_layers, device)
        self.v_scale = _scale_vector(v_scale, num_layers, device)

    def _allocate(self, device: torch.device | str) -> None:
        """K and V zeroed: one [L, ...] tensor each, or one tensor per layer."""
        shapes, n, page = self.layer_shapes, len(self.layer_shapes), self.page_size
        if len(set(shapes)) == 1:
            shape = (n, self.num_pages, page, *shapes[0])
            self.k = torch.zeros(shape, dtype=self.dtype, device=device)
            self.v = torch.zeros(shape, dtype=self.dtype, device=device)
        else:
            self.k, self.v = (tuple(torch.zeros(self.num_pages, page, *s, dtype=self.dtype,
                                                device=device) for s in shapes)
                              for _ in range(2))
        self.released = False

    def release(self) -> None:
        """Free K and V (`LLM.sleep`): they become empty tensors on the same device, so
        nothing may read or write the cache until `restore`; the page table and the scales
        stay. Captured graphs that point at the old K and V must be freed first."""
        device = self.page_table.device
        empty = torch.empty(0, dtype=self.dtype, device=device)
        self.k, self.v = ((empty, empty) if self.uniform else
                          (tuple(empty for _ in self.layer_shapes),) * 2)
        self.released = True

    def restore(self) -> None:
        """Allocate K and V again (zeros) after `release`; nothing if they are held."""
        if self.released:
            self._allocate(self.page_table.device)

    def set_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        """Copy new per-layer scales ([L] each) into an FP8 cache's, in place (captured
        graphs read them from the same memory).

        Raises:
            ValueError: the cache is not FP8, or not one scale per layer."""
        n = len(self.layer_shapes)
        if not self.quantized or k_scale.numel() != n or v_scale.numel() != n:
            raise ValueError(f"set_scales: one scale per layer ({n}) for an FP8 cache; got "
                             f"{k_scale.numel()} and {v_scale.numel()} for {self.dtype}")
        self.k_scale.copy_(k_scale.reshape(n))
        self.v_scale.copy_(v_scale.reshape(n))

    @property
    def quantized(self) -> bool:
        """Whether K and V are stored in FP8 with per-layer scales."""
        return self.dtype == KV_FP8

    @property
    def uniform(self) -> bool:
        """Whether every layer has the same head shape (k, v: one [L, ...] tensor each)."""
        return isinstance(self.k, torch.Tensor)

    @property
    def nbytes(self) -> int:
        """Bytes of K and V (both, all layers)."""
        return 2 * sum(t.numel() * t.element_size() for t in self.k)

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(k_scale, v_scale) of `layer`: 0-d fp32 views on the device, or (None, None) when
        the cache is not FP8."""
        if not self.quantized:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """Flat slot index [n] int64 of each position [n]."""
        return paged_slots(self.page_table, self.page_size, positions)

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write k, v: [n, Hkv, D] of the tokens at `positions` [n] (no host sync); an FP8
        cache quantises them with the layer's scales."""
        paged_write(self.k[layer], self.v[layer], self.page_table, positions, k, v,
                    *self.scales(layer))

    def read(self, layer: int, length: int, dtype: torch.dtype | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `length` tokens' k, v of layer `layer`: [length, Hkv, D] each, in `dtype`
        (default: the cache's dtype, float32 for FP8); an FP8 cache's are dequantised."""
        slots = self.slots(torch.arange(length, device=self.page_table.device))
        heads = self.layer_shapes[layer]
        if not self.quantized:
            k = self.k[layer].view(-1, *heads)[slots]
            v = self.v[layer].view(-1, *heads)[slots]
            return (k, v) if dtype is None else (k.to(dtype), v.to(dtype))
        # NOTE: FP8 pages are gathered as bytes (not every index kernel takes float8)
        k = self.k[layer].view(torch.uint8).view(-1, *heads)[slots].view(KV_FP8)
        v = self.v[layer].view(torch.uint8).view(-1, *heads)[slots].view(KV_FP8)
        k_scale, v_scale = self.scales(layer)
        dtype = dtype or torch.float32
        return dequantize_kv(k, k_scale, dtype), dequantize_kv(v, v_scale, dtype)
