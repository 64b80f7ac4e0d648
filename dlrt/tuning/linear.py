"""Per linear layer, the faster of cuBLAS and the skinny Triton GEMM, chosen at load.

Each distinct weight shape [N, K] of a model's linear layers is timed at M = block rows inside
a CUDA graph (as it runs in the block graph), reading its weight from HBM and fed by an RMSNorm
kernel (as in a layer, so the Triton GEMM's programmatic dependent launch can overlap its
producer): cuBLAS (`F.linear`) against a few `GemmConfig`s of `dlrt.kernels.skinny_gemm`. The
Triton kernel replaces cuBLAS for a shape when it is at least 3% faster. Timings are cached per
device, dtype and rows under DLRT_CACHE_DIR/gemm, so later loads skip them. `tune` returns a
`LinearPlan` (module name -> `LinearMethod`) that `apply` sets on one model's layers: two
models in one process keep their own choices.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from dlrt import env
from dlrt.layers.linear import LinearBase
from dlrt.layers.quant import LinearMethod
from dlrt.layers.quant.unquantized import CUBLAS, SkinnyGemmLinear
from dlrt.tuning.timing import graph_us

if TYPE_CHECKING:  # the kernels need Triton: imported where a plan times them
    from dlrt.kernels.skinny_gemm import GemmConfig

log = logging.getLogger(__name__)

POLICIES = ("auto", "cublas", "triton")
BLOCKS = ((16, 256), (16, 512), (32, 256), (64, 256))  # (block_n, block_k) of "dot"
# (block_n, block_k, warps) of the GEMV: 16 weight elements per thread and tile, various
# shapes of the tile and of its warps along K
GEMV_BLOCKS = ((4, 512, 4), (8, 256, 4), (8, 512, 8), (16, 256, 8), (16, 512, 8),
               (4, 1024, 8), (4, 1024, 4), (8, 1024, 4), (4, 2048, 8), (8, 512, 2))
GEMV_AHEAD = (1, 2, 4)  # weight tiles in flight
SMALL_GEMV_BLOCK = (8, 64, 1)  # for K that no block above divides (small test models)
COLD_BYTES = 256 << 20  # cycle through this many bytes of weight copies: more than the L2
MARGIN = 0.97  # the Triton kernel must be at least 3% faster to replace cuBLAS


@dataclass
class LinearPlan:
    """The method of every linear layer of a model, by module name, and the timing record of
    every weight shape ({"N,K": {cublas_us, triton_us, config, norm_us, chosen}})."""

    methods: dict[str, LinearMethod] = field(default_factory=dict)
    records: dict[str, dict] = field(default_factory=dict)

    def apply(self, model: nn.Module) -> None:
        """Set each planned layer's method (layers not in the plan keep theirs)."""
        for name, module in model.named_modules():
            if name in self.methods:
                module.method = self.methods[name]


def candidates(n: int, k: int, sms: int, rows: int = 16) -> list[GemmConfig]:
    """Configs for [N, K] at `rows` rows: "dot" with split-K grown until the grid covers the
    GPU about twice; the "fma" GEMV configs too when rows <= 4."""
    from dlrt.kernels.skinny_gemm import FMA_ROWS, GemmConfig

    blocks = [b for b in GEMV_BLOCKS if k % b[1] == 0] or [SMALL_GEMV_BLOCK]
    out = [GemmConfig(bn, bk, 1, stages=ahead, warps=w, kind="fma")
           for bn, bk, w in blocks for ahead in GEMV_AHEAD
           if rows <= FMA_ROWS and k % bk == 0]
    for bn, bk in BLOCKS:
        tiles, split = -(-n // bn), 1
        while tiles * split < 2 * sms and k % (2 * split * bk) == 0 and split < 8:
            split *= 2
        cfg = GemmConfig(bn, bk, split)
        if cfg.fits(n, k):
            out.append(cfg)
    return out


def _copies(w: torch.Tensor, most: int) -> list[torch.Tensor]:
    """w and up to `most` clones of it: together more than COLD_BYTES (more than the L2
    cache), so each use streams them from HBM."""
    return [w] + [w.clone() for _ in range(min(most, COLD_BYTES // (w.numel() * w.element_size())))]


def time_shape(w: torch.Tensor, rows: int) -> dict:
    """{'cublas_us', 'triton_us', 'config', 'norm_us'} for weight w at `rows` rows: each time
    includes the feeding RMSNorm kernel, which `norm_us` times alone.

    Calls cycle through copies of w that together exceed the L2 cache, so every call streams
    its weight from HBM as in a round (a weight that fits in L2 would otherwise be timed
    from there)."""
    from dlrt.kernels.rms_norm import rms_norm
    from dlrt.kernels.skinny_gemm import skinny_gemm

    x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
    norm_w = torch.ones(w.shape[1], dtype=w.dtype, device=w.device)
    copies = _copies(w, most=15)
    sms = torch.cuda.get_device_properties(w.device).multi_processor_count

    def cycle(fn):  # each product fed by a norm kernel, as the projections of a layer are
        return lambda: [fn(rms_norm(x, norm_w, 1e-6), c) for c in copies]

    per = len(copies)
    best = dict(cublas_us=graph_us(cycle(F.linear), reps=2) / per,
                triton_us=None, config=None,
                norm_us=graph_us(cycle(lambda h, c: None), reps=2) / per)
    for cfg in candidates(*w.shape, sms, rows):
        us = graph_us(cycle(lambda h, c, g=cfg: skinny_gemm(h, c, g)), reps=2) / per
        if best["triton_us"] is None or us < best["triton_us"]:
            best.update(triton_us=us, config=asdict(cfg))
    return best


def triton_wins(rec: dict) -> bool:
    return rec["config"] is not None and rec["triton_us"] < MARGIN * rec["cublas_us"]


def _cache_path(w: torch.Tensor, rows: int) -> Path:
    from dlrt.kernels import pdl

    name = torch.cuda.get_device_name(w.device).replace(" ", "_")
    tag = "-pdl" if pdl.enabled(w) else ""
    return env.cache_dir() / "gemm" / f"v6-{name}-{str(w.dtype)[6:]}-m{rows}{tag}.json"


def linear_layers(model: nn.Module) -> dict[str, LinearBase]:
    """Every linear layer of the model by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LinearBase)}


def tune(model: nn.Module, rows: int = 4, policy: str = "auto", timer=time_shape,
         cache_file: Path | None = None) -> LinearPlan:
    """Plan every linear layer's method (on CUDA; `timer(weight, rows)` times one shape).

    policy: "auto" (the faster per shape, Triton only when at least 3% faster), "triton" (the
    fastest Triton config for every shape that has one), "cublas" (no timing).
    cache_file: where timings are kept (default: per device under DLRT_CACHE_DIR/gemm).
    Layers with a quantised method (FP8, NVFP4) are not planned here (`dlrt.tuning.quant`).
    Returns the plan; the model is not changed (`LinearPlan.apply`).
    """
    if policy not in POLICIES:
        raise ValueError(f"linear kernel policy {policy!r} is not one of {POLICIES}")
    layers = {n: m for n, m in linear_layers(model).items() if not m.method.quantized}
    plan = LinearPlan({name: CUBLAS for name in layers})
    if policy == "cublas" or not layers:
        return plan
    from dlrt.kernels.skinny_gemm import GemmConfig

    weights: dict[str, torch.Tensor] = {}
    for m in layers.values():
        weights.setdefault(_shape_key(m.weight), m.weight)
    path = cache_file or _cache_path(next(iter(weights.values())), rows)
    cached = read_cache(path)
    records = {key: dict(cached.get(key) or timer(w, rows)) for key, w in weights.items()}
    if records.keys() - cached.keys():
        write_cache(path, {**cached, **records})
    methods: dict[str, LinearMethod] = {}
    for key, rec in records.items():
        triton = triton_wins(rec) or (policy == "triton" and rec["config"] is not None)
        rec["chosen"] = "triton" if triton else "cublas"
        methods[key] = SkinnyGemmLinear(GemmConfig(**rec["config"])) if triton else CUBLAS
    plan.methods = {name: methods[_shape_key(m.weight)] for name, m in layers.items()}
    plan.records = records
    log.info("projection kernels: %s", {k: rec["chosen"] for k, rec in records.items()})
    return plan


def _shape_key(w: torch.Tensor) -> str:
    return f"{w.shape[0]},{w.shape[1]}"


def read_cache(path) -> dict:
    """A timing cache file's records; {} when absent or unreadable (it is timed again)."""
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def write_cache(path, records: dict) -> None:
    """Replace the cache file whole (a temporary file, then a rename): processes timing the
    same shapes at once (tensor-parallel ranks) never leave a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records, indent=1))
    os.replace(tmp, path)
