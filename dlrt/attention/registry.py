"""Attention backends by name, and the default per device and decoder. What a backend serves is
its own answer (`AttentionBackend.supports`); the registry asks it.

Backends are imported lazily: only the one named is imported (FlashInfer itself only when its
backend is asked what it serves or built).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

import torch

from dlrt.attention.base import AttentionBackend
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.errors import OptionError
from dlrt.ops.reference import KV_FP8

log = logging.getLogger(__name__)

# name -> (module, class)
_BACKENDS = {
    "sdpa": ("dlrt.attention.sdpa", "SDPABackend"),
    "triton": ("dlrt.attention.triton", "TritonBackend"),
    "flashinfer": ("dlrt.attention.flashinfer", "FlashInferBackend"),
    "flashinfer-fa2": ("dlrt.attention.flashinfer", "FlashInferFA2Backend"),
}


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def backend_class(name: str) -> type[AttentionBackend]:
    """The class of backend `name` (its module imported on first use).

    Raises:
        OptionError: unknown name, or a module the backend needs is not installed.
    """
    if name not in _BACKENDS:
        raise OptionError(f"unknown attention backend {name!r}; available: {backend_names()}")
    module, cls = _BACKENDS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise OptionError(f"attention backend {name!r} needs {e.name}: pip install {e.name}") from e
    return getattr(mod, cls)


def check_backend(name: str, device: torch.device, dtype: torch.dtype, execution_mode: str,
                  head_dim: int | None = None, kv_cache_dtype: torch.dtype | None = None,
                  needs: tuple[str, ...] = ()) -> None:
    """Whether backend `name` can serve this device, dtype, execution mode and (when given)
    the model's head size, the KV cache's dtype (None: the model dtype) and the model's
    attention needs (`ModelConfig.attention_needs`): the backend's `supports`.

    Raises:
        OptionError: unknown name, or the reason the backend gives (it says what to use); e.g.
            an FP8 cache (float8_e4m3fn) on FlashInfer, or on 'triton' before sm_89 or for a
            decoder that writes nothing to the cache; a sliding window on FlashInfer.
    """
    why = backend_class(name).supports(device, dtype, execution_mode, head_dim, kv_cache_dtype,
                                       needs)
    if why is not None:
        raise OptionError(why)


def default_backend(device: torch.device, dtype: torch.dtype, decoder: str,
                    head_dim: int, kv_cache_dtype: torch.dtype | None = None,
                    needs: tuple[str, ...] = ()) -> str:
    """The backend used when none is asked for: 'sdpa' on the CPU; for a model whose
    attention has `needs` (a sliding window, per-layer head shapes, the chunk's K/V beside the
    cache: DiffusionGemma), 'triton' where it serves them (not with an FP8 KV cache), else
    'sdpa'; on Hopper (sm_90) with
    FlashInfer installed, 'flashinfer' for the canvas decoder (a LLaDA canvas fills FA3's
    query tiles: its attention took 249 us per round instead of 1085 us with 'triton' at a
    256-token canvas of LLaDA-8B on the H200) when it serves the model (not an FP8 KV cache,
    its dtypes and head sizes); 'triton' otherwise (a block of a few queries: the Triton
    kernel took half FlashInfer's time on SDAR-1.7B and SDAR-8B)."""
    if device.type != "cuda":
        return "sdpa"
    if needs:
        try:
            why = backend_class("triton").supports(device, dtype, "eager", head_dim,
                                                   kv_cache_dtype, needs)
        except OptionError as e:  # Triton not installed
            why = str(e)
        return "triton" if why is None else "sdpa"
    if kv_cache_dtype == KV_FP8:
        return "triton"
    if decoder == "canvas" and torch.cuda.get_device_capability(device)[0] == 9 \
            and importlib.util.find_spec("flashinfer") is not None:
        from dlrt.attention.flashinfer import DTYPES, HEAD_DIMS

        if head_dim not in HEAD_DIMS or dtype not in DTYPES:
            return "triton"
        # installed, but it may not import (e.g. built for another torch)
        why = backend_class("flashinfer").supports(device, dtype, "eager", head_dim)
        if why is None:
            return "flashinfer"
        log.warning("%s; attention runs on 'triton'", why)
    return "triton"


def get_backend(name: str, cache: PagedKVCache, num_q_heads: int) -> AttentionBackend:
    """Build the attention backend `name` over `cache`: 'sdpa' (reference), 'triton' (paged
    kernel), 'flashinfer' (FA3/FA2 kernels) or 'flashinfer-fa2'.

    Raises:
        OptionError: unknown backend name, or a module it needs is not installed (with the fix).
    """
    return backend_class(name)(cache, num_q_heads)
