"""Per weight shape, the faster of cuBLAS and the skinny Triton GEMM, chosen at load.

Each distinct [N, K] of a model's dense projections is timed at M = block rows inside a CUDA
graph (as it runs in the block graph), reading its weight from HBM and fed by an RMSNorm kernel
(as in a layer, so the Triton GEMM's programmatic dependent launch can overlap its producer):
cuBLAS (`F.linear`) against a few `GemmConfig`s of `dlrt.kernels.skinny_gemm`. The Triton
kernel replaces cuBLAS for a shape when it is at least 3% faster. The choice is kept in
`dlrt.layers.linear.CHOICES`; results are cached per device, dtype and PDL under
DLRT_CACHE_DIR/gemm so later loads skip the timing.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import asdict

import torch
import torch.nn.functional as F

from dlrt import env
from dlrt.kernels import pdl
from dlrt.kernels.rms_norm import rms_norm
from dlrt.kernels.skinny_gemm import FMA_ROWS, GemmConfig, skinny_gemm

log = logging.getLogger(__name__)

BLOCKS = ((16, 256), (16, 512), (32, 256), (64, 256))  # (block_n, block_k) of "dot"
# (block_n, block_k, warps) of the GEMV: 16 weight elements per thread and tile
GEMV_BLOCKS = ((4, 512, 4), (8, 256, 4), (8, 512, 8), (16, 256, 8), (4, 1024, 8))


def candidates(n: int, k: int, sms: int, rows: int = 16) -> list[GemmConfig]:
    """Configs for [N, K] at `rows` rows: "dot" with split-K grown until the grid covers the
    GPU about twice; the "fma" GEMV configs too when rows <= 4."""
    out = [GemmConfig(bn, bk, 1, stages=ahead, warps=w, kind="fma")
           for bn, bk, w in GEMV_BLOCKS for ahead in (1, 2)
           if rows <= FMA_ROWS and k % bk == 0]
    for bn, bk in BLOCKS:
        tiles, split = -(-n // bn), 1
        while tiles * split < 2 * sms and k % (2 * split * bk) == 0 and split < 8:
            split *= 2
        cfg = GemmConfig(bn, bk, split)
        if cfg.fits(n, k):
            out.append(cfg)
    return out


def event_us(fn, reps: int = 5) -> float:
    """Median over `reps` calls of `fn`'s GPU time in microseconds (CUDA events, the device
    idle before each call)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def graph_us(fn, reps: int = 20) -> float:
    """Microseconds per call, replayed from a graph of `reps` calls (median of 5)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(reps):
            fn()
    return event_us(g.replay) / reps


COLD_BYTES = 256 << 20  # cycle through this many bytes of weight copies: more than the L2
MARGIN = 0.97  # the Triton kernel must be at least 3% faster to replace cuBLAS


def time_shape(w: torch.Tensor, rows: int) -> dict:
    """{'cublas_us', 'triton_us', 'config', 'norm_us'} for weight w at `rows` rows: each time
    includes the feeding RMSNorm kernel, which `norm_us` times alone.

    Calls cycle through copies of w that together exceed the L2 cache, so every call streams
    its weight from HBM as in a round (a weight that fits in L2 would otherwise be timed
    from there)."""
    x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
    norm_w = torch.ones(w.shape[1], dtype=w.dtype, device=w.device)
    copies = [w] + [w.clone() for _ in range(min(15, COLD_BYTES // (w.numel() * w.element_size())))]
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


def _cache_path(w: torch.Tensor, rows: int):
    name = torch.cuda.get_device_name(w.device).replace(" ", "_")
    tag = "-pdl" if pdl.enabled(w) else ""
    return env.cache_dir() / "gemm" / f"v4-{name}-{str(w.dtype)[6:]}-m{rows}{tag}.json"


def tune(model: torch.nn.Module, rows: int = 4, force: bool = False) -> dict[str, dict]:
    """Choose per dense weight shape of `model` (on CUDA) and fill `linear.CHOICES`;
    `force` takes the fastest Triton config for every shape that has one.

    Returns {"N,K": timing record}. Weights of MoE experts and embeddings are not projections.
    """
    from dlrt.layers import linear

    weights: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if p.dim() == 2 and ".experts." not in name and "embed" not in name \
                and "wte" not in name:
            weights.setdefault(f"{p.shape[0]},{p.shape[1]}", p)
    if not weights:
        return {}
    path = _cache_path(next(iter(weights.values())), rows)
    cached = json.loads(path.read_text()) if path.is_file() else {}
    records = {}
    for key, w in weights.items():
        records[key] = cached.get(key) or time_shape(w, rows)
    if records.keys() - cached.keys():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**cached, **records}, indent=1))
    for key, w in weights.items():
        rec = records[key] = dict(records[key])
        triton = triton_wins(rec) or (force and rec["config"] is not None)
        rec["chosen"] = "triton" if triton else "cublas"
        linear.CHOICES[(w.shape[0], w.shape[1], w.dtype)] = \
            GemmConfig(**rec["config"]) if triton else None
    log.info("projection kernels: %s", {k: rec["chosen"] for k, rec in records.items()})
    return records
