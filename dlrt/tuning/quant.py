"""Per quantised linear layer, the dequantising reference or a low-precision Triton kernel,
chosen at load, generic over the registered formats (`dlrt.layers.quant.registry`: each format
names the layers a plan may serve, their kernel arguments, the reference, the kernel configs
worth timing and its tolerance; the layer's method makes the planned method).

For every layer whose format `tuned` it (FP8 with block-layout scales, `FP8_FORMAT`; NVFP4;
compressed-tensors FP8), each distinct (format, N, K, activation mode) is planned at M = block
rows: first every candidate kernel (`QuantFormat.kernel_configs`; FP8:
`dlrt.kernels.fp8_gemm.fp8_candidates`, with dynamic activations the W8A8 configs, weight-only
the "dot" configs and, at rows <= 4, the "fma" GEMV configs; compressed-tensors FP8 the same on
per-channel scales, without the GEMV; NVFP4: `nvfp4_candidates`) is checked against the layer's
reference path (the same activation mode) on a random input: the relative error ||y - y_ref|| /
||y_ref|| must be within the format's `tolerance` (2e-2). A candidate that raises or fails the
check is skipped with a warning. The reference and the passing candidates are then timed as
`tuning.linear` times BF16 shapes (inside a CUDA graph, weights cycled through more than the L2
cache, each call fed by an RMSNorm kernel). The fastest passing candidate replaces the
reference when it is at least 3% faster (policy "triton": whenever one passes). Records are
cached per device, dtype and rows under DLRT_CACHE_DIR/gemm, keyed "<format>,N,K" (",w8a8"
added for dynamic activations).

`choose` holds the decision with the timing and the check injected, so it runs anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from dlrt.layers.linear import LinearBase
from dlrt.layers.quant import LinearMethod
from dlrt.layers.quant.registry import get_format
from dlrt.tuning.linear import COLD_BYTES, MARGIN, _cache_path, read_cache, write_cache
from dlrt.tuning.timing import graph_us

log = logging.getLogger(__name__)

REFERENCE = "reference"

# time(kernel or None for the reference, rows) -> us; check(kernel, rows) -> relative error
TimeFn = Callable[[Callable | None], float]
CheckFn = Callable[[Callable], float]


def _k(layer: nn.Module) -> int:
    """The layer's in features K (elements; a packed weight holds fewer columns)."""
    return layer.quant_cols["weight"]


def quant_layers(model: nn.Module) -> dict[str, tuple[str, LinearBase]]:
    """The layers a quantised plan may serve, by module name: (format name, layer) for the
    linear layers whose format `tuned` them (FP8 layers with a scale row per weight row,
    `FP8_ROWS_FORMAT`, keep the reference path)."""
    out = {}
    for name, m in model.named_modules():
        fmt = getattr(m, "quant_format", None)
        if isinstance(m, LinearBase) and fmt is not None and fmt.tuned(m):
            out[name] = (fmt.name, m)
    return out


def _shape_key(fmt: str, layer: nn.Module) -> str:
    key = f"{fmt},{layer.weight.shape[0]},{_k(layer)}"
    return key + ",w8a8" if get_format(fmt).activations(layer) == "dynamic" else key


def candidates(fmt: str, n: int, k: int, rows: int, device: torch.device | None = None,
               activations: str = "weight_only") -> dict[str, dict]:
    """{label: config as a dict} of every kernel of format `fmt` worth trying for (N, K) at
    rows in the activation mode `activations` (FP8 dynamic: the W8A8 configs)."""
    cfgs = get_format(fmt).kernel_configs(n, k, rows, device, activations)
    return {_label(asdict(c)): asdict(c) for c in cfgs}


def _label(cfg: dict) -> str:
    kind = cfg.get("kind", "dot") + ("-w8a8" if cfg.get("w8a8") else "")
    return (f"{kind} n{cfg['block_n']} k{cfg['block_k']} s{cfg['split_k']} "
            f"st{cfg['stages']} w{cfg['warps']}")


def kernel(fmt: str, cfg: dict) -> Callable:
    """The kernel of format `fmt` with config `cfg` bound (`QuantFormat.kernel`)."""
    return get_format(fmt).kernel(cfg)


def choose(fmt: str, configs: dict[str, dict], time: TimeFn, check: CheckFn,
           policy: str = "auto") -> dict:
    """The record of one (format, N, K): {reference_us, candidates: {label: {config, error,
    us, skipped}}, chosen (a label or "reference"), chosen_us}. Each candidate is checked
    (`check(kernel)`: its relative error against the reference), then timed (`time(kernel)`;
    `time(None)` times the reference); one that raises or exceeds its tolerance is skipped."""
    rec = dict(reference_us=time(None), candidates={}, chosen=REFERENCE, chosen_us=None)
    tolerance = get_format(fmt).tolerance
    for label, cfg in configs.items():
        entry = dict(config=cfg, error=None, us=None, skipped=None)
        rec["candidates"][label] = entry
        try:
            fn = kernel(fmt, cfg)
            entry["error"] = err = float(check(fn))
            if not err <= tolerance:  # NaN fails too
                entry["skipped"] = f"relative error {err:.3g} > {tolerance}"
            else:
                entry["us"] = float(time(fn))
        except Exception as e:  # noqa: BLE001 - a candidate that fails is skipped
            entry["skipped"] = f"{type(e).__name__}: {e}"
        if entry["skipped"]:
            log.warning("%s kernel %s skipped: %s", fmt, label, entry["skipped"])
    _decide(rec, policy)
    return rec


def _decide(rec: dict, policy: str) -> None:
    passing = {k: e["us"] for k, e in rec["candidates"].items() if e["us"] is not None}
    rec["chosen"], rec["chosen_us"] = REFERENCE, rec["reference_us"]
    if passing:
        best = min(passing, key=passing.get)
        if policy == "triton" or passing[best] < MARGIN * rec["reference_us"]:
            rec["chosen"], rec["chosen_us"] = best, passing[best]


def relative_error(layer: nn.Module, fmt: str, fn: Callable, rows: int, dtype: torch.dtype,
                   seed: int = 0) -> float:
    """||fn(x) - reference(x)|| / ||reference(x)|| for a random x [rows, K] in `dtype`."""
    form = get_format(fmt)
    held = form.kernel_args(layer)
    gen = torch.Generator(device=held[0].device).manual_seed(seed)
    x = torch.randn(rows, _k(layer), generator=gen, device=held[0].device).to(dtype)
    ref = form.reference(form.activations(layer))(x, *held).float()
    y = fn(x, *held).float()
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def graph_time(layer: nn.Module, fmt: str, fn: Callable | None, rows: int,
               dtype: torch.dtype) -> float:
    """Microseconds of one product (None: the reference path) at `rows` rows inside a CUDA
    graph, fed by an RMSNorm kernel, cycling through copies of the held tensors that together
    exceed the L2 cache."""
    from dlrt.kernels.rms_norm import rms_norm

    form = get_format(fmt)
    held = form.kernel_args(layer)
    k = _k(layer)
    x = torch.randn(rows, k, dtype=dtype, device=held[0].device)
    norm_w = torch.ones(k, dtype=dtype, device=x.device)
    nbytes = sum(t.numel() * t.element_size() for t in held)
    copies = [held] + [tuple(t.clone() for t in held)
                       for _ in range(min(15, COLD_BYTES // max(nbytes, 1)))]
    fn = fn or form.reference(form.activations(layer))
    return graph_us(lambda: [fn(rms_norm(x, norm_w, 1e-6), *c) for c in copies],
                    reps=2) / len(copies)


def tune_quant(model: nn.Module, dtype: torch.dtype, rows: int = 4, policy: str = "auto",
               time=None, check=None, cache_file: Path | None = None
               ) -> tuple[dict[str, LinearMethod], dict[str, dict]]:
    """Plan the quantised layers of `model` (see the module docstring): (methods by module
    name, records by "<format>,N,K"). Layers without a faster passing kernel get a method
    without one (the reference path); layers `quant_layers` leaves out are not in the plan.

    time(layer, fmt, kernel or None, rows) and check(layer, fmt, kernel, rows) default to
    `graph_time` (CUDA) and `relative_error`; tests inject their own.
    policy "cublas": nothing is timed; every layer keeps its method.
    """
    layers = quant_layers(model)
    if policy == "cublas" or not layers:
        return {}, {}
    time = time or (lambda m, f, fn, r: graph_time(m, f, fn, r, dtype))
    check = check or (lambda m, f, fn, r: relative_error(m, f, fn, r, dtype))
    shapes: dict[str, tuple[str, nn.Module]] = {}
    for fmt, m in layers.values():
        shapes.setdefault(_shape_key(fmt, m), (fmt, m))
    first = next(iter(shapes.values()))[1].weight
    if cache_file is None:
        probe = _cache_path(torch.empty(0, dtype=dtype, device=first.device), rows)
        cache_file = probe.with_name(f"quant-{probe.name}")
    path = cache_file
    cached = read_cache(path)
    records: dict[str, dict] = {}
    for key, (fmt, m) in shapes.items():
        if key in cached:
            records[key] = dict(cached[key])
            _decide(records[key], policy)
            continue
        n, k = (int(v) for v in key.split(",")[1:3])
        configs = candidates(fmt, n, k, rows, m.weight.device,
                             get_format(fmt).activations(m))
        records[key] = choose(fmt, configs, lambda fn, f=fmt, lay=m: time(lay, f, fn, rows),
                              lambda fn, f=fmt, lay=m: check(lay, f, fn, rows), policy)
    if records.keys() - cached.keys():
        write_cache(path, {**cached, **records})
    methods: dict[str, LinearMethod] = {}
    for name, (fmt, m) in layers.items():
        rec = records[_shape_key(fmt, m)]
        if rec["chosen"] == REFERENCE:
            methods[name] = m.method.planned(None, None)
            continue
        cfg = rec["candidates"][rec["chosen"]]["config"]
        methods[name] = m.method.planned(kernel(fmt, cfg), cfg)
    log.info("quantised projection kernels: %s", {k: r["chosen"] for k, r in records.items()})
    return methods, records
