"""Environment variables read by dlrt (all `DLRT_`-prefixed), typed, in one place.

Only whole-process settings live here; every engine option is a field of
`dlrt.engine.config.EngineConfig`.
"""

from __future__ import annotations

import os
from pathlib import Path

from dlrt.errors import OptionError


def cache_dir() -> Path:
    """DLRT_CACHE_DIR: where the built CUDA kernels and the kernel timings are kept (default
    $XDG_CACHE_HOME/dlrt, else ~/.cache/dlrt)."""
    value = os.environ.get("DLRT_CACHE_DIR")
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dlrt"


def attention_backend() -> str | None:
    """DLRT_ATTENTION_BACKEND: the attention backend when `attention_backend` is "auto"
    ('sdpa', 'triton', 'flashinfer', 'flashinfer-fa2'); unset = choose per device and
    decoder (`dlrt.attention.registry.default_backend`)."""
    return os.environ.get("DLRT_ATTENTION_BACKEND") or None


def commit() -> str | None:
    """DLRT_COMMIT: the commit to record in benchmark results when the tree has no .git."""
    return os.environ.get("DLRT_COMMIT") or None


def api_key() -> str | None:
    """DLRT_API_KEY: the key `dlrt serve` asks for (`Authorization: Bearer KEY` on every
    endpoint but /health) when `--api-key` is not given; unset = no key. OptionError when it
    is set but empty (or blank): it would ask for nothing."""
    value = os.environ.get("DLRT_API_KEY")
    if value is not None and not value.strip():
        raise OptionError("DLRT_API_KEY is set but empty: set it to a key, or unset it to "
                          "serve without one")
    return value


SPLIT_K_REDUCE = ("fused", "kernel")


def split_k_reduce() -> str:
    """DLRT_SPLIT_K_REDUCE: how the split-K GEMMs sum their partials ('fused': the last split
    of each output tile, in the GEMM; 'kernel': a second kernel; `dlrt.kernels.split_k`).
    Default 'fused'. ValueError on another value."""
    value = os.environ.get("DLRT_SPLIT_K_REDUCE") or "fused"
    if value not in SPLIT_K_REDUCE:
        raise ValueError(f"DLRT_SPLIT_K_REDUCE={value!r}: expected one of {SPLIT_K_REDUCE}")
    return value


def persistent_prefetch_bytes() -> int:
    """DLRT_PERSISTENT_PREFETCH: weight bytes of the next projection task in its queue that a
    CTA of the persistent round kernel asks L2 to prefetch when it picks a task (0: none;
    `dlrt.runtime.persistent.kernel`). Default 0: off (64 KiB measured slower than none,
    `benchmarks/results/RESULTS.md`). ValueError unless a non-negative integer."""
    value = os.environ.get("DLRT_PERSISTENT_PREFETCH") or "0"
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"DLRT_PERSISTENT_PREFETCH={value!r}: expected a byte count >= 0")
    return int(value)


def persistent_pages() -> int:
    """DLRT_PERSISTENT_PAGES: shared-memory weight pages (32 KiB each) of the persistent round
    kernel's page ring, at most 6 and as many as fit beside its other shared memory (0: the
    projections read their weights from global memory; the ring needs sm_90, so older GPUs
    run without it; `dlrt.runtime.persistent.kernel`). Default 0. ValueError unless a
    non-negative integer."""
    value = os.environ.get("DLRT_PERSISTENT_PAGES") or "0"
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"DLRT_PERSISTENT_PAGES={value!r}: expected a page count >= 0")
    return int(value)


def persistent_wait_limit_s() -> float:
    """DLRT_PERSISTENT_WAIT_LIMIT: seconds a CTA of the persistent round kernel waits for a
    dependency before it traps (a fault, not a hang; 0: no limit, e.g. under a debugger).
    Default 2. ValueError unless a non-negative number."""
    value = os.environ.get("DLRT_PERSISTENT_WAIT_LIMIT") or "2"
    try:
        limit = float(value)
    except ValueError:
        limit = -1.0
    if not limit >= 0 or limit == float("inf"):
        raise ValueError(f"DLRT_PERSISTENT_WAIT_LIMIT={value!r}: expected seconds >= 0")
    return limit
