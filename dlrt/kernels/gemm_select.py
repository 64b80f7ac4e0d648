"""Per weight shape, the faster of cuBLAS and the skinny Triton GEMM, chosen at load.

Each distinct [N, K] of a model's dense projections is timed at M = block rows inside a CUDA
graph (as it runs in the block graph), reading its weight from HBM and fed by an RMSNorm kernel
(as in a layer, so the Triton GEMM's programmatic dependent launch can overlap its producer):
cuBLAS (`F.linear`) against a few `GemmConfig`s of `dlrt.kernels.skinny_gemm`. The Triton
kernel replaces cuBLAS for a shape when it is at least 3% faster. The choice is kept in
`dlrt.layers.linear.CHOICES`. Then, at <= 4 rows, a dense layer's projections as fused GEMVs
(`dlrt.layers.gemv_layer`) are timed against the classic layer with those choices, and every
dense layer takes the fused form when it is at least 3% faster. Results are cached per device,
dtype, rows and PDL under DLRT_CACHE_DIR/gemm so later loads skip the timing.
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
from dlrt.kernels.activation import silu_mul
from dlrt.kernels.rms_norm import rms_norm
from dlrt.kernels.skinny_gemm import FMA_ROWS, GemmConfig, gemv, skinny_gemm

log = logging.getLogger(__name__)

BLOCKS = ((16, 256), (16, 512), (32, 256), (64, 256))  # (block_n, block_k) of "dot"
# (block_n, block_k, warps) of the GEMV: 16 weight elements per thread and tile; then tiles
# whose warps all lie along K (`GemmConfig.x_row`: what an RMSNorm or SiLU prologue needs)
GEMV_BLOCKS = ((4, 512, 4), (8, 256, 4), (8, 512, 8), (16, 256, 8), (16, 512, 8),
               (4, 1024, 8), (4, 1024, 4), (8, 1024, 4), (4, 2048, 8), (8, 512, 2))
GEMV_AHEAD = (1, 2, 4)  # weight tiles in flight
SMALL_GEMV_BLOCK = (8, 64, 1)  # for K that no block above divides (small test models)


def candidates(n: int, k: int, sms: int, rows: int = 16) -> list[GemmConfig]:
    """Configs for [N, K] at `rows` rows: "dot" with split-K grown until the grid covers the
    GPU about twice; the "fma" GEMV configs too when rows <= 4."""
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


def _copies(tensors: tuple[torch.Tensor, ...], most: int) -> list[tuple[torch.Tensor, ...]]:
    """`tensors` and up to `most` sets of clones of them: together more than COLD_BYTES (more
    than the L2 cache), so each use streams them from HBM."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return [tensors] + [tuple(t.clone() for t in tensors)
                        for _ in range(min(most, COLD_BYTES // nbytes))]


def time_shape(w: torch.Tensor, rows: int) -> dict:
    """{'cublas_us', 'triton_us', 'config', 'norm_us'} for weight w at `rows` rows: each time
    includes the feeding RMSNorm kernel, which `norm_us` times alone.

    Calls cycle through copies of w that together exceed the L2 cache, so every call streams
    its weight from HBM as in a round (a weight that fits in L2 would otherwise be timed
    from there)."""
    x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
    norm_w = torch.ones(w.shape[1], dtype=w.dtype, device=w.device)
    copies = [c for (c,) in _copies((w,), most=15)]
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


def role_candidates(role: str, w: torch.Tensor, sms: int, rows: int) -> list[GemmConfig]:
    """The GEMV configs for weight w in the fused layer's `role` ('qkv', 'o', 'gate_up',
    'down'). A role whose GEMV transforms its input (RMSNorm or SiLU prologue) takes the tiles
    whose warps lie along K (`GemmConfig.x_row`), where it computes each value once, unless
    none fits."""
    fma = [c for c in candidates(*w.shape, sms, rows) if c.kind == "fma"]
    if role == "o":
        return fma
    return [c for c in fma if c.x_row()] or fma


def time_layer(w, rows: int) -> dict:
    """The projections of a dense layer (`dlrt.layers.gemv_layer.DenseWeights`) at `rows`
    rows, classic against fused, each in one CUDA graph cycling through weight copies:

    classic: add+RMSNorm, QKV, o_proj, add+RMSNorm, gate-up, SiLU-and-mul, down (cuBLAS or
    Triton per shape as `linear.CHOICES` says, so call this after they are set);
    fused: the four GEMVs of `gemv_layer.forward`, each with its fastest config, chosen by
    timing every GEMV config on that projection in its fused form.

    Returns {'classic_us', 'fused_us', 'configs': {role: GemmConfig fields}, 'role_us':
    {role: us of its fused GEMV alone}}: microseconds per layer (attention excluded: it is the
    same in both)."""
    from dlrt.layers.linear import linear

    dev, dtype = w.qkv.device, w.qkv.dtype
    hidden, inter = w.qkv.shape[1], w.down.shape[1]
    x = torch.randn(rows, hidden, dtype=dtype, device=dev)
    attn = torch.randn(rows, w.o.shape[1], dtype=dtype, device=dev)
    gate_up = torch.randn(rows, 2 * inter, dtype=dtype, device=dev)
    n1, n2 = w.attn_norm, w.mlp_norm
    copies = _copies((w.qkv, w.o, w.gate_up, w.down), most=3)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    roles = {  # role -> (index in a copy, fused call)
        "qkv": (0, lambda c, g: gemv(x, c, g, norm=n1.weight, eps=n1.eps)),
        "o": (1, lambda c, g: gemv(attn, c, g, residual=x)),
        "gate_up": (2, lambda c, g: gemv(x, c, g, norm=n2.weight, eps=n2.eps)),
        "down": (3, lambda c, g: gemv(gate_up, c, g, silu=True, residual=x)),
    }
    configs, role_us, per = {}, {}, len(copies)
    for role, (i, call) in roles.items():
        best = None
        for cfg in role_candidates(role, copies[0][i], sms, rows):
            us = graph_us(lambda g=cfg, i=i, f=call: [f(c[i], g) for c in copies], reps=2)
            if best is None or us < best[0]:
                best = us, cfg
        role_us[role], configs[role] = best[0] / per, best[1]
    residual = x.clone()

    def classic(c):
        h = rms_norm(x, n1.weight, n1.eps, residual)
        linear(h, c[0])
        h = rms_norm(linear(attn, c[1]), n2.weight, n2.eps, residual)
        linear(silu_mul(linear(h, c[2])), c[3])

    def fused(c):
        gemv(x, c[0], configs["qkv"], norm=n1.weight, eps=n1.eps)
        s = gemv(attn, c[1], configs["o"], residual=x)
        gu = gemv(s, c[2], configs["gate_up"], norm=n2.weight, eps=n2.eps)
        gemv(gu, c[3], configs["down"], silu=True, residual=s)

    return dict(classic_us=graph_us(lambda: [classic(c) for c in copies], reps=2) / per,
                fused_us=graph_us(lambda: [fused(c) for c in copies], reps=2) / per,
                configs={role: asdict(cfg) for role, cfg in configs.items()}, role_us=role_us)


def triton_wins(rec: dict) -> bool:
    return rec["config"] is not None and rec["triton_us"] < MARGIN * rec["cublas_us"]


def _cache_path(w: torch.Tensor, rows: int):
    name = torch.cuda.get_device_name(w.device).replace(" ", "_")
    tag = "-pdl" if pdl.enabled(w) else ""
    return env.cache_dir() / "gemm" / f"v5-{name}-{str(w.dtype)[6:]}-m{rows}{tag}.json"


def tune(model: torch.nn.Module, rows: int = 4, force: bool = False) -> dict[str, dict]:
    """Choose per dense weight shape of `model` (on CUDA) and fill `linear.CHOICES`;
    `force` takes the fastest Triton config for every shape that has one, and the fused GEMV
    layer (`dlrt.layers.gemv_layer`).

    Returns {"N,K": timing record, "layer": record of `time_layer`}; the layer record only
    when rows <= 4 and the model has dense layers. Weights of MoE experts and embeddings are
    not projections.
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
    _tune_layers(model, rows, force, {**cached, **records}, records, path)
    log.info("projection kernels: %s", {k: rec["chosen"] for k, rec in records.items()})
    return records


def _tune_layers(model, rows, force, stored, records, path) -> None:
    """Time the fused GEMV layer against the classic one (`time_layer`) and set
    `LayerGEMVs` on every dense layer when it is faster; the record goes to records['layer']
    and to the cache file, whose contents are `stored`."""
    from dlrt.layers.gemv_layer import LayerGEMVs

    layers = [(m, m.dense_weights()) for m in model.modules()
              if callable(getattr(m, "dense_weights", None))]
    for m, _ in layers:
        m.gemvs = None  # classic unless chosen below
    layers = [(m, w) for m, w in layers if w is not None]
    if rows > FMA_ROWS or not layers:
        return

    def shapes(w):
        return tuple(tuple(t.shape) for t in (w.qkv, w.o, w.gate_up, w.down))

    w = layers[0][1]
    layers = [(m, lw) for m, lw in layers if shapes(lw) == shapes(w)]  # timed: these shapes
    sms = torch.cuda.get_device_properties(w.qkv.device).multi_processor_count
    roles = {"qkv": w.qkv, "o": w.o, "gate_up": w.gate_up, "down": w.down}
    if not all(role_candidates(r, t, sms, rows) for r, t in roles.items()):
        return  # some projection has no GEMV config
    # the classic time depends on the per-shape choices, which `force` changes
    key = "layer " + " ".join(f"{a},{b}" for a, b in shapes(w)) + (" forced" if force else "")
    if key not in stored:
        stored[key] = time_layer(w, rows)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=1))
    rec = dict(stored[key])
    fused = force or rec["fused_us"] < MARGIN * rec["classic_us"]
    rec["chosen"] = "fused" if fused else "classic"
    gemvs = LayerGEMVs(**{r: GemmConfig(**c) for r, c in rec["configs"].items()}) \
        if fused else None
    for m, _ in layers:
        m.gemvs = gemvs
    records["layer"] = rec
