"""Environment variables read by dlrt (all `DLRT_`-prefixed), typed, in one place."""

from __future__ import annotations

import os
from pathlib import Path

from dlrt.errors import OptionError


def cache_dir() -> Path:
    """DLRT_CACHE_DIR: where the embedded default model is made (default ~/.cache/dlrt)."""
    value = os.environ.get("DLRT_CACHE_DIR")
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dlrt"


def attention_backend() -> str | None:
    """DLRT_ATTENTION_BACKEND: force an attention backend ('sdpa', 'triton', 'flashinfer',
    'flashinfer-fa2'); None = choose per device and decoder (`default_backend`)."""
    return os.environ.get("DLRT_ATTENTION_BACKEND") or None


def commit() -> str | None:
    """DLRT_COMMIT: the commit to record in benchmark results when the tree has no .git."""
    return os.environ.get("DLRT_COMMIT") or None


def fused_kernels() -> bool:
    """DLRT_FUSED_KERNELS: '0' runs the unfused PyTorch ops on CUDA too (default: fused)."""
    return os.environ.get("DLRT_FUSED_KERNELS", "1") != "0"


def skinny_gemm() -> str:
    """DLRT_SKINNY_GEMM: '0' keeps every projection on cuBLAS, 'all' puts every projection
    shape on the Triton GEMM (its fastest config) and every dense layer of at most 4 rows on
    the fused GEMV layer (`dlrt.layers.gemv_layer`), default: per-shape choice ('1')."""
    value = os.environ.get("DLRT_SKINNY_GEMM", "1")
    if value not in ("0", "1", "all"):
        raise OptionError(f"DLRT_SKINNY_GEMM must be 0, 1 or all, got {value!r}")
    return value


def pdl() -> bool:
    """DLRT_PDL: '0' launches the Triton kernels without programmatic dependent launch
    (default: PDL on compute capability 9.0+)."""
    return os.environ.get("DLRT_PDL", "1") != "0"

