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
import importlib.util
import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from dlrt.errors import OptionError
from dlrt.runtime.kv_cache import PagedKVCache

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class AttentionSpan:
    """Host-side lengths of one forward: n queries, chunk_block (None = full attention), and
    the (start, kv_len) its `lens` will hold. Host-planned backends plan from these."""

    n: int
    chunk_block: int | None
    start: int
    kv_len: int


class AttentionBackend(Protocol):
    """Computes attention for one layer of one forward.

    A backend whose kernels need a host-side plan per length sets `plans_on_host = True` and
    implements `plan_block(spans, cache, num_q_heads)` (the forwards of the block about to be
    launched) and `disarm()` (that block is launched).
    """

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
    "flashinfer": ("dlrt.attention.flashinfer", "FlashInferBackend", True, True),
    "flashinfer-fa2": ("dlrt.attention.flashinfer", "FlashInferFA2Backend", True, True),
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


def check_device(name: str, device: torch.device, dtype: torch.dtype) -> None:
    """Whether backend `name` can run on `device` in `dtype`.

    Raises:
        OptionError: unknown name, or what the backend needs is missing (says what to use).
    """
    _known(name)
    if name.startswith("flashinfer"):
        from dlrt.attention.flashinfer import kernel_for

        kernel_for(device, "auto", name)
        if dtype not in FLASHINFER_DTYPES:
            raise OptionError(f"attention backend {name!r} needs bfloat16 or float16, not "
                              f"{dtype}; use 'triton' for {dtype}")


FLASHINFER_HEAD_DIMS = (64, 128, 256)
FLASHINFER_DTYPES = (torch.bfloat16, torch.float16)


def check_model(name: str, head_dim: int) -> None:
    """Whether backend `name` has kernels for the model's head size.

    Raises:
        OptionError: FlashInfer and a head size it does not build (says what to use).
    """
    if name.startswith("flashinfer") and head_dim not in FLASHINFER_HEAD_DIMS:
        raise OptionError(f"attention backend {name!r} has kernels for head_dim "
                          f"{FLASHINFER_HEAD_DIMS}, not {head_dim}; use 'triton'")


def default_backend(device: torch.device, dtype: torch.dtype, decoder: str,
                    head_dim: int) -> str:
    """The backend used when none is asked for: 'sdpa' on the CPU; on Hopper (sm_90) with
    FlashInfer installed, 'flashinfer' for the canvas decoder (a LLaDA canvas fills FA3's
    query tiles: its attention took 249 us per round instead of 1085 us with 'triton' at a
    256-token canvas of LLaDA-8B on the H200); 'triton' otherwise (a block of a few queries:
    the Triton kernel took half FlashInfer's time on SDAR-1.7B and SDAR-8B)."""
    if device.type != "cuda":
        return "sdpa"
    if decoder == "canvas" and head_dim in FLASHINFER_HEAD_DIMS and dtype in FLASHINFER_DTYPES \
            and torch.cuda.get_device_capability(device)[0] == 9 \
            and importlib.util.find_spec("flashinfer") is not None:
        from dlrt.attention.flashinfer import kernel_for

        try:  # installed, but it may not import (e.g. built for another torch)
            kernel_for(device, "auto")
            return "flashinfer"
        except OptionError as e:
            log.warning("%s; attention runs on 'triton'", e)
    return "triton"


def _known(name: str) -> None:
    if name not in _BACKENDS:
        raise OptionError(f"unknown attention backend {name!r}; available: {backend_names()}")


def get_backend(name: str) -> AttentionBackend:
    """Instantiate the attention backend `name`: 'sdpa' (reference), 'triton' (paged
    kernel), 'flashinfer' (FA3/FA2 kernels) or 'flashinfer-fa2'.

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
