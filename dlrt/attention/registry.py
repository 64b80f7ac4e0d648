"""Attention backends by name, their capabilities, and the default per device and decoder.

Backends are imported lazily: `get_backend` imports only the one asked for, and the checks
that need FlashInfer import it only when it is named.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os

import torch

from dlrt.attention.base import AttentionBackend
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.errors import OptionError
from dlrt.ops.reference import KV_FP8

log = logging.getLogger(__name__)

# name -> (module, class, graph capturable)
_BACKENDS = {
    "sdpa": ("dlrt.attention.sdpa", "SDPABackend", False),
    "triton": ("dlrt.attention.triton", "TritonBackend", True),
    "flashinfer": ("dlrt.attention.flashinfer", "FlashInferBackend", True),
    "flashinfer-fa2": ("dlrt.attention.flashinfer", "FlashInferFA2Backend", True),
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


def check_backend(name: str, device: torch.device, dtype: torch.dtype, execution_mode: str,
                  head_dim: int | None = None, kv_cache_dtype: torch.dtype | None = None
                  ) -> None:
    """Whether backend `name` can serve this device, dtype, execution mode and (when given)
    the model's head size and the KV cache's dtype (None: the model dtype).

    Raises:
        OptionError: unknown name, or what the backend needs is missing (says what to use);
            an FP8 cache (float8_e4m3fn) on FlashInfer, or on 'triton' before sm_89.
    """
    _known(name)
    if kv_cache_dtype == KV_FP8:
        _check_fp8_cache(name, device)
    if name.startswith("flashinfer"):
        from dlrt.attention.flashinfer import check_flashinfer

        check_flashinfer(name, device, dtype, head_dim)
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise OptionError("attention backend 'triton' needs a CUDA device (on the CPU it runs "
                          "only in Triton's interpreter, TRITON_INTERPRET=1); use 'sdpa'")
    if execution_mode != "eager" and not capturable(name):
        raise OptionError(f"execution_mode {execution_mode!r} needs a graph-capturable "
                          f"attention backend (triton, flashinfer), not {name!r}")


def _check_fp8_cache(name: str, device: torch.device) -> None:
    if name.startswith("flashinfer"):
        raise OptionError(f"attention backend {name!r} does not read an FP8 KV cache "
                          "(kv_cache_dtype='fp8': per-layer scales read from device memory); "
                          "use attention_backend='triton'")
    if name == "triton" and device.type == "cuda" \
            and torch.cuda.get_device_capability(device) < (8, 9):
        raise OptionError("kv_cache_dtype='fp8' with attention backend 'triton' needs a GPU of "
                          "compute capability 8.9+ (FP8 loads); use kv_cache_dtype='auto'")


def default_backend(device: torch.device, dtype: torch.dtype, decoder: str,
                    head_dim: int, kv_cache_dtype: torch.dtype | None = None) -> str:
    """The backend used when none is asked for: 'sdpa' on the CPU; on Hopper (sm_90) with
    FlashInfer installed, 'flashinfer' for the canvas decoder (a LLaDA canvas fills FA3's
    query tiles: its attention took 249 us per round instead of 1085 us with 'triton' at a
    256-token canvas of LLaDA-8B on the H200) unless the KV cache is FP8 (FlashInfer does not
    read it); 'triton' otherwise (a block of a few queries: the Triton kernel took half
    FlashInfer's time on SDAR-1.7B and SDAR-8B)."""
    if device.type != "cuda":
        return "sdpa"
    if kv_cache_dtype == KV_FP8:
        return "triton"
    if decoder == "canvas" and torch.cuda.get_device_capability(device)[0] == 9 \
            and importlib.util.find_spec("flashinfer") is not None:
        from dlrt.attention.flashinfer import DTYPES, HEAD_DIMS, check_flashinfer

        if head_dim not in HEAD_DIMS or dtype not in DTYPES:
            return "triton"
        try:  # installed, but it may not import (e.g. built for another torch)
            check_flashinfer("flashinfer", device, dtype, head_dim)
            return "flashinfer"
        except OptionError as e:
            log.warning("%s; attention runs on 'triton'", e)
    return "triton"


def _known(name: str) -> None:
    if name not in _BACKENDS:
        raise OptionError(f"unknown attention backend {name!r}; available: {backend_names()}")


def get_backend(name: str, cache: PagedKVCache, num_q_heads: int) -> AttentionBackend:
    """Build the attention backend `name` over `cache`: 'sdpa' (reference), 'triton' (paged
    kernel), 'flashinfer' (FA3/FA2 kernels) or 'flashinfer-fa2'.

    Raises:
        OptionError: unknown backend name, or its requirements are not met (with the fix).
    """
    _known(name)
    module, cls, _ = _BACKENDS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise OptionError(f"attention backend {name!r} needs {e.name}: pip install {e.name}") from e
    return getattr(mod, cls)(cache, num_q_heads)
