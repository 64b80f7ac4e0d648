"""The attention backend interface and the per-forward context that layers receive.

A forward processes a chunk of N tokens at positions start..start+N-1. The attention layer
first writes every chunk token's K/V into the paged cache at its position (positions past the
committed length are scratch: the decoder decides what is committed); then each query attends
to cache keys 0..kv_len-1: the whole prefix before `start`, and inside the chunk either every
key (full, `chunk_block=None`) or its own block and earlier ones (block-causal, blocks of
`chunk_block` tokens counted from the chunk start). `start` and `kv_len` live in a device
tensor (`lens`), so a captured CUDA graph serves every context length.
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
    """Layout of one forward.

    positions: [N] int64 absolute positions of the chunk (start + arange(N)).
    lens: [2] int32 on the model's device: (start, kv_len).
    chunk_block: block-causal block length inside the chunk, or None for full attention.
    """

    positions: torch.Tensor
    lens: torch.Tensor
    chunk_block: int | None


class AttentionBackend(Protocol):
    """Computes attention for one layer of one forward."""

    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache) -> torch.Tensor:
        """q: [N, Hq, D] (RoPE applied) -> [N, Hq, D] in q.dtype.

        The chunk's K/V are already in `cache` at `meta.positions` (the attention layer
        writes them); Hq is a multiple of the cache's Hkv.
        """
        ...


@dataclass
class ForwardContext:
    """What the attention layers of one forward need: the backend, its metadata, the cache."""

    backend: AttentionBackend
    meta: ForwardMeta
    cache: PagedKVCache

    def attend(self, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        return self.backend.forward(layer, q, scale, self.meta, self.cache)


# name -> (module, class, graph capturable, needs CUDA)
_BACKENDS = {
    "sdpa": ("dlrt.attention.sdpa", "SDPABackend", False, False),
    "triton": ("dlrt.attention.triton", "TritonBackend", True, False),
}


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def capturable(name: str) -> bool:
    """Whether the backend reads lengths from device memory (usable inside a CUDA graph).

    Raises:
        OptionError: unknown backend name.
    """
    _known(name)
    return _BACKENDS[name][2]


def _known(name: str) -> None:
    if name not in _BACKENDS:
        raise OptionError(f"unknown attention backend {name!r}; available: {backend_names()}")


def get_backend(name: str) -> AttentionBackend:
    """Instantiate the attention backend `name` ('sdpa' reference, 'triton' paged kernel).

    Raises:
        OptionError: unknown backend name, or its requirements are not met (with the fix).
    """
    _known(name)
    module, cls, _, _ = _BACKENDS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise OptionError(f"attention backend {name!r} needs {e.name}: pip install {e.name}") from e
    return getattr(mod, cls)()
