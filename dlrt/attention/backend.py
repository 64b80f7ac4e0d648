"""The attention backend interface and the per-forward context that layers receive.

A forward processes a chunk of N consecutive tokens starting at absolute position `ctx_len`,
right after the `ctx_len` tokens held in the KV cache. Every query sees the whole cached
prefix. Inside the chunk, attention is full (`chunk_block=None`) or block-causal with blocks of
`chunk_block` tokens counted from the chunk start (a query sees its own block and earlier ones).
After attention the first `write_len` chunk tokens' K/V are written to the cache at `ctx_len`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

import torch

from dlrt.errors import OptionError
from dlrt.runtime.kv_cache import PagedKVCache


@dataclass(frozen=True)
class ForwardMeta:
    """Layout of one forward. Lengths in tokens."""

    ctx_len: int
    chunk_block: int | None
    write_len: int


class AttentionBackend(Protocol):
    """Computes attention for one layer of one forward."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: float, meta: ForwardMeta, cache: PagedKVCache | None) -> torch.Tensor:
        """q: [N, Hq, D], k/v: [N, Hkv, D] (RoPE applied) -> [N, Hq, D] in q.dtype.

        Writes the first `meta.write_len` chunk K/V into `cache` at `meta.ctx_len`.
        """
        ...


@dataclass
class ForwardContext:
    """What the attention layers of one forward need: the backend, its metadata, the cache."""

    backend: AttentionBackend
    meta: ForwardMeta
    cache: PagedKVCache | None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        return self.backend.forward(layer, q, k, v, scale, self.meta, self.cache)


_BACKENDS = {"sdpa": ("dlrt.attention.sdpa", "SDPABackend")}


def get_backend(name: str) -> AttentionBackend:
    """Instantiate the attention backend `name` (currently: 'sdpa').

    Raises:
        OptionError: unknown backend name.
    """
    if name not in _BACKENDS:
        raise OptionError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
