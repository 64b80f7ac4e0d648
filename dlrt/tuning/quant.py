"""Per quantised linear layer, the dequantising reference or a low-precision Triton kernel,
chosen at load.

For every layer whose method is an `Fp8Linear` holding block-layout scales (`FP8_FORMAT`) or
an `Nvfp4Linear`, each distinct (format, N, K, FP8 activation mode) is planned at M = block
rows: first every candidate kernel (`dlrt.kernels.fp8_gemm.fp8_candidates`: with dynamic
activations the W8A8 configs; weight-only the "dot" configs and, at rows <= 4, the "fma" GEMV
configs; NVFP4: `nvfp4_candidates`) is checked against the layer's reference path (the same
activation mode) on a random input: the relative error ||y - y_ref|| / ||y_ref|| must be
within `TOLERANCE` (2e-2). A candidate that raises or fails the check is skipped with a
warning. The reference and the passing candidates are then timed as `tuning.linear` times
BF16 shapes (inside a CUDA graph, weights cycled through more than the L2 cache, each call
fed by an RMSNorm kernel). The fastest passing candidate replaces the reference when it is
at least 3% faster (policy "triton": whenever one passes). Records are cached per device,
dtype and rows under DLRT_CACHE_DIR/gemm, keyed "<format>,N,K" (",w8a8" added for FP8 with
dynamic activations).

`choose` holds the decision with the timing and the check injected, so it runs anywhere.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.layers.linear import LinearBase
from dlrt.layers.quant import LinearMethod
from dlrt.layers.quant.fp8 import Fp8Linear, _blocks, reference_linear
from dlrt.layers.quant.nvfp4 import Nvfp4Linear, dequantize_nvfp4
from dlrt.tuning.linear import COLD_BYTES, MARGIN, _cache_path, read_cache, write_cache
from dlrt.tuning.timing import graph_us

log = logging.getLogger(__name__)

TOLERANCE = {"fp8": 2e-2, "nvfp4": 2e-2}  # relative error bound against the reference
REFERENCE = "reference"

# time(kernel or None for the reference, rows) -> us; check(kernel, rows) -> relative error
TimeFn = Callable[[Callable | None], float]
CheckFn = Callable[[Callable], float]


def _held(layer: nn.Module, fmt: str) -> tuple[torch.Tensor, ...]:
    if fmt == "fp8":
        return layer.weight, layer.weight_scale_inv
    return layer.weight, layer.weight_scale, layer.weight_scale_2


def _activations(layer: nn.Module, fmt: str) -> str:
    return layer.method.activations if fmt == "fp8" else "weight_only"


def _reference(fmt: str, activations: str = "weight_only") -> Callable:
    if fmt == "fp8":
        return lambda x, w, s: reference_linear(x, w, s, activations)
    return lambda x, w, s, g: F.linear(x, dequantize_nvfp4(w, s, g, x.dtype))


def quant_layers(model: nn.Module) -> dict[str, tuple[str, LinearBase]]:
    """The layers a quantised plan may serve, by module name: (format, layer) for FP8 layers
    with block-layout scales and NVFP4 layers. FP8 layers with a scale row per weight row
    (`FP8_ROWS_FORMAT`) keep the reference path."""
    out = {}
    for name, m in model.named_modules():
        if not isinstance(m, LinearBase):
            continue
        if isinstance(m.method, Fp8Linear) \
                and m.weight_scale_inv.shape[0] == _blocks(m.weight.shape[0]):
            out[name] = ("fp8", m)
        elif isinstance(m.method, Nvfp4Linear):
            out[name] = ("nvfp4", m)
    return out


def _shape_key(fmt: str, layer: nn.Module) -> str:
    n, k = layer.weight.shape
    key = f"{fmt},{n},{k * 2 if fmt == 'nvfp4' else k}"
    return key + ",w8a8" if fmt == "fp8" and _activations(layer, fmt) == "dynamic" else key


def candidates(fmt: str, n: int, k: int, rows: int, device: torch.device | None = None,
               activations: str = "weight_only") -> dict[str, dict]:
    """{label: config as a dict} of every kernel worth trying for (format, N, K) at rows:
    FP8 with dynamic activations the W8A8 configs, weight-only the others."""
    if fmt == "fp8":
        from dlrt.kernels.fp8_gemm import fp8_candidates

        cfgs = fp8_candidates(n, k, w8a8=activations == "dynamic", device=device, rows=rows)
    else:
        from dlrt.kernels.nvfp4_gemm import nvfp4_candidates

        cfgs = nvfp4_candidates(n, k, device=device)
    return {_label(asdict(c)): asdict(c) for c in cfgs}


def _label(cfg: dict) -> str:
    kind = cfg.get("kind", "dot") + ("-w8a8" if cfg.get("w8a8") else "")
    return (f"{kind} n{cfg['block_n']} k{cfg['block_k']} s{cfg['split_k']} "
            f"st{cfg['stages']} w{cfg['warps']}")


def kernel(fmt: str, cfg: dict) -> Callable:
    """The kernel of `fmt` with config `cfg` bound (an `Fp8Kernel` / `Nvfp4Kernel`)."""
    if fmt == "fp8":
        from dlrt.kernels.fp8_gemm import Fp8GemmConfig, fp8_gemm

        return functools.partial(fp8_gemm, config=Fp8GemmConfig(**cfg))
    from dlrt.kernels.nvfp4_gemm import Nvfp4GemmConfig, nvfp4_gemm

    return functools.partial(nvfp4_gemm, config=Nvfp4GemmConfig(**cfg))


def choose(fmt: str, configs: dict[str, dict], time: TimeFn, check: CheckFn,
           policy: str = "auto") -> dict:
    """The record of one (format, N, K): {reference_us, candidates: {label: {config, error,
    us, skipped}}, chosen (a label or "reference"), chosen_us}. Each candidate is checked
    (`check(kernel)`: its relative error against the reference), then timed (`time(kernel)`;
    `time(None)` times the reference); one that raises or exceeds its tolerance is skipped."""
    rec = dict(reference_us=time(None), candidates={}, chosen=REFERENCE, chosen_us=None)
    for label, cfg in configs.items():
        entry = dict(config=cfg, error=None, us=None, skipped=None)
        rec["candidates"][label] = entry
        try:
            fn = kernel(fmt, cfg)
            entry["error"] = err = float(check(fn))
            if not err <= TOLERANCE[fmt]:  # NaN fails too
                entry["skipped"] = f"relative error {err:.3g} > {TOLERANCE[fmt]}"
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
    held = _held(layer, fmt)
    k = held[0].shape[1] * (2 if fmt == "nvfp4" else 1)
    gen = torch.Generator(device=held[0].device).manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, device=held[0].device).to(dtype)
    ref = _reference(fmt, _activations(layer, fmt))(x, *held).float()
    y = fn(x, *held).float()
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def graph_time(layer: nn.Module, fmt: str, fn: Callable | None, rows: int,
               dtype: torch.dtype) -> float:
    """Microseconds of one product (None: the reference path) at `rows` rows inside a CUDA
    graph, fed by an RMSNorm kernel, cycling through copies of the held tensors that together
    exceed the L2 cache."""
    from dlrt.kernels.rms_norm import rms_norm

    held = _held(layer, fmt)
    k = held[0].shape[1] * (2 if fmt == "nvfp4" else 1)
    x = torch.randn(rows, k, dtype=dtype, device=held[0].device)
    norm_w = torch.ones(k, dtype=dtype, device=x.device)
    nbytes = sum(t.numel() * t.element_size() for t in held)
    copies = [held] + [tuple(t.clone() for t in held)
                       for _ in range(min(15, COLD_BYTES // max(nbytes, 1)))]
    fn = fn or _reference(fmt, _activations(layer, fmt))
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
        configs = candidates(fmt, n, k, rows, m.weight.device, _activations(m, fmt))
        records[key] = choose(fmt, configs, lambda fn, f=fmt, lay=m: time(lay, f, fn, rows),
                              lambda fn, f=fmt, lay=m: check(lay, f, fn, rows), policy)
    if records.keys() - cached.keys():
        write_cache(path, {**cached, **records})
    methods: dict[str, LinearMethod] = {}
    for name, (fmt, m) in layers.items():
        rec = records[_shape_key(fmt, m)]
        cls = Fp8Linear if fmt == "fp8" else Nvfp4Linear
        mode = m.method.mode() if fmt == "fp8" else {}
        if rec["chosen"] == REFERENCE:
            methods[name] = cls(max_rows=m.method.max_rows, **mode)
            continue
        cfg = rec["candidates"][rec["chosen"]]["config"]
        most = 4 if cfg.get("kind") == "fma" else 64  # the config's max_rows()
        wide = {}
        if fmt == "fp8" and most < m.method.max_rows:  # a GEMV (weight-only): the default
            from dlrt.kernels.fp8_gemm import fp8_gemm  # weight-only "dot" above its rows

            wide = dict(wide=fp8_gemm, wide_rows=m.method.max_rows)
        methods[name] = cls(kernel(fmt, cfg), max_rows=min(most, m.method.max_rows), **wide,
                            **mode)
    log.info("quantised projection kernels: %s", {k: r["chosen"] for k, r in records.items()})
    return methods, records
