"""The low-precision weight-streaming GEMMs against the BF16 ones, at given shapes.

For every weight shape [N, K] and row count M, each candidate computes y[M, N] = x @ W^T with
x bf16 from an RMSNorm kernel (as in a layer, so programmatic dependent launch can overlap the
producer), timed per call inside a CUDA graph that cycles through copies of the weight larger
than the L2 cache (each call streams its weight from HBM, as in a round):

  bf16 cublas      F.linear on the BF16 weight (the baseline)
  bf16 triton      `dlrt.kernels.skinny_gemm`, the fastest of the load-time tuner's configs
  fp8 cublas       torch._scaled_mm on e4m3 x and weight with per-tensor scales (cuBLASLt; not
                   the block-scaled numerics: a floor of what cuBLAS does with FP8 bytes)
  fp8 weight-only  `dlrt.kernels.fp8_gemm`, 128 x 128 block scales, x bf16 (tensor-core
                   kernel; at M <= 4 the GEMV's configs compete too)
  fp8 w8a8         the same weight, x quantised per token and 128-column group
                   (`fp8_gemm.quantize_x`, then the fp8 x fp8 kernel)
  fp8 deepgemm     DeepGEMM's `fp8_gemm_nt` (sgl-deep-gemm) on the same x codes and weight,
                   when the package is installed
  nvfp4            `dlrt.kernels.nvfp4_gemm`, per-16 e4m3 scales and a global scale

Each Triton variant times its default config and up to `configs` candidates and keeps the
fastest. A row reports the time per call without the norm (`us`), the weight bytes it must
read (`MB`: the format's byte floor, scales included), the achieved bandwidth (`GBps`), its
ratio to the device's copy bandwidth (`vs_copy`), the time the floor would take at the copy
bandwidth (`floor_us`), its speed-up over BF16 cuBLAS (`vs_bf16`) and its error against the
dequantised weight in fp32 (`rel_err`: max abs difference over max abs reference; W8A8
includes its activation quantisation).

    python -m dlrt.bench.quant_kernels                      # SDAR-8B shapes, M = 1, 4, 16
    python -m dlrt.bench.quant_kernels --rows 4 --shapes 4096x4096 --configs 16

Every config is a Triton compile (the GEMVs once per M): the default run (5 shapes, 3 row
counts, 8 configs per variant) compiles a few hundred kernels; where one device call must
stay under 10 minutes, pass fewer --shapes or --configs per call.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F

from dlrt.bench.report import BENCH_OUT, table, write_json
from dlrt.tuning.timing import graph_us

COLUMNS = ["shape", "M", "impl", "us", "MB", "GBps", "vs_copy", "floor_us", "vs_bf16",
           "rel_err", "config"]
SDAR_8B = ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (12288, 4096))
COLD_BYTES = 256 << 20  # weight copies cycled per graph: more than the L2 cache


def _cold(tensors: tuple[torch.Tensor, ...], most: int = 15) -> list[tuple[torch.Tensor, ...]]:
    """The weight's tensors and clones of them, together more than COLD_BYTES."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    copies = min(most, COLD_BYTES // max(nbytes, 1))
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(copies)]


def _time(fn: Callable[..., Any], copies: list[tuple[torch.Tensor, ...]], norm) -> float:
    """Microseconds per call of fn(h, *weight) with h = norm() fed fresh for every call."""
    return graph_us(lambda: [fn(norm(), *c) for c in copies], reps=2) / len(copies)


def held_weights(w: torch.Tensor) -> dict[str, tuple[torch.Tensor, ...]]:
    """w [N, K] -> the tensors each format's kernel reads, as the layers hold them: "bf16"
    (w,), "fp8" (e4m3 [N, K], scale_inv [ceil(N/128), ceil(K/128)]: 128 x 128 blocks) and,
    when K is a multiple of 16, "nvfp4" (uint8 [N, K/2], e4m3 [N, K/16], the global scale
    fp32 [1]) (`dlrt.layers.quant.fp8.quantize_fp8_block`, `nvfp4.quantize_nvfp4`)."""
    from dlrt.layers.quant.fp8 import quantize_fp8_block
    from dlrt.layers.quant.nvfp4 import quantize_nvfp4

    out = {"bf16": (w,), "fp8": quantize_fp8_block(w)}
    if w.shape[1] % 16 == 0:
        p, sc, g = quantize_nvfp4(w)
        out["nvfp4"] = (p, sc, g.reshape(1))
    return out


def dequantised(fmt: str, held: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The fp32 weight [N, K] that `held` (from `held_weights`) stands for."""
    from dlrt.layers.quant.fp8 import dequantize_fp8_block
    from dlrt.layers.quant.nvfp4 import dequantize_nvfp4

    if fmt == "fp8":
        return dequantize_fp8_block(*held, torch.float32)
    if fmt == "nvfp4":
        p, sc, g = held
        return dequantize_nvfp4(p, sc, g.expand(p.shape[0]), torch.float32)
    return held[0].float()


def _best(fn, configs, copies, norm) -> tuple[float, Any]:
    best = (float("inf"), None)
    for cfg in configs:
        us = _time(lambda h, *c, g=cfg: fn(h, *c, g), copies, norm)
        if us < best[0]:
            best = (us, cfg)
    return best


def bench_shape(n: int, k: int, rows: tuple[int, ...] = (1, 4, 16), configs: int = 8,
                seed: int = 0) -> list[dict[str, Any]]:
    """Rows of the report (see the module docstring) for the weight shape [n, k]."""
    from dlrt.kernels.fp8_gemm import fp8_candidates, fp8_config, fp8_gemm, quantize_x
    from dlrt.kernels.nvfp4_gemm import nvfp4_candidates, nvfp4_config, nvfp4_gemm
    from dlrt.kernels.rms_norm import rms_norm
    from dlrt.kernels.skinny_gemm import skinny_gemm
    from dlrt.tuning.linear import candidates

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    torch.manual_seed(seed)
    w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
    held = held_weights(w)
    q8, s8 = held["fp8"]
    one = torch.ones((), device=dev)
    cold = {fmt: _cold(t) for fmt, t in held.items()}
    ref_w = {fmt: dequantised(fmt, t) for fmt, t in held.items()}
    nbytes = {"bf16": 2 * n * k, "fp8": n * k + 4 * s8.numel(),
              "nvfp4": n * k // 2 + n * (k // 16) + 4}

    def pick(cands, default):
        step = max(1, len(cands) // max(configs, 1))
        return list(dict.fromkeys([default] + cands[::step][:configs]))

    out = []
    for m in rows:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        norm_w = torch.ones(k, device=dev, dtype=torch.bfloat16)

        def norm(x=x, norm_w=norm_w):
            return rms_norm(x, norm_w, 1e-6)

        h = norm()
        norm_us = _time(lambda h: None, [()], norm)
        impls: list[tuple[str, str, float, Any, torch.Tensor | None]] = []
        us = _time(lambda h, w: F.linear(h, w), cold["bf16"], norm)
        impls.append(("bf16 cublas", "bf16", us, None, F.linear(h, w)))
        if m <= 16:
            cands = candidates(n, k, sms, m)  # GEMV configs first at m <= 4, then "dot"
            cands = cands[::max(1, len(cands) // max(2 * configs, 1))]
            us, cfg = _best(skinny_gemm, cands, cold["bf16"], norm)
            impls.append(("bf16 triton", "bf16", us, cfg, skinny_gemm(h, w, cfg)))
        try:  # cuBLASLt FP8 with per-tensor scales (rows padded to 16)
            xq = torch.zeros(max(16, -(-m // 16) * 16), k, device=dev, dtype=torch.float8_e4m3fn)

            def scaled(h, q, s, xq=xq):
                return torch._scaled_mm(xq, q.t(), scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16)

            us = _time(scaled, cold["fp8"], norm)
            impls.append(("fp8 cublas", "fp8", us, "per-tensor scales", None))
        except (RuntimeError, TypeError) as e:
            print(f"[{n},{k}] M={m}: torch._scaled_mm unavailable ({type(e).__name__})")
        for w8a8 in (False, True):
            cands = fp8_candidates(n, k, w8a8, dev, rows=m)  # the GEMV's too at m <= 4
            cfgs = pick(cands, fp8_config(m, n, k, w8a8, dev))
            us, cfg = _best(fp8_gemm, cfgs, cold["fp8"], norm)
            name = "fp8 w8a8" if w8a8 else "fp8 weight-only"
            impls.append((name, "fp8", us, cfg, fp8_gemm(h, q8, s8, cfg)))
        try:  # DeepGEMM's block-scaled W8A8 GEMM, x quantised as dlrt's W8A8 does
            import deep_gemm

            def deepgemm(h, q, s):
                xq, xs = quantize_x(h)
                y = torch.empty(h.shape[0], n, device=dev, dtype=torch.bfloat16)
                deep_gemm.fp8_gemm_nt((xq, xs), (q, s), y)
                return y

            us = _time(deepgemm, cold["fp8"], norm)
            impls.append(("fp8 deepgemm", "fp8", us, "fp8_gemm_nt", deepgemm(h, q8, s8)))
        except Exception as e:  # noqa: BLE001 - absent, or refusing this shape: say so
            print(f"[{n},{k}] M={m}: DeepGEMM not timed ({type(e).__name__}: {e})")
        if "nvfp4" in held:
            cfgs = pick(nvfp4_candidates(n, k, dev), nvfp4_config(m, n, k, dev))
            us, cfg = _best(nvfp4_gemm, cfgs, cold["nvfp4"], norm)
            impls.append(("nvfp4", "nvfp4", us, cfg, nvfp4_gemm(h, *held["nvfp4"], cfg)))
        base = impls[0][2] - norm_us
        for name, fmt, us, cfg, y in impls:
            alone = max(us - norm_us, 1e-3)
            row = dict(shape=f"[{n},{k}]", M=m, impl=name, us=alone, norm_us=norm_us,
                       MB=nbytes[fmt] / 1e6, GBps=nbytes[fmt] / alone / 1e3,
                       vs_bf16=base / alone,
                       config=asdict(cfg) if hasattr(cfg, "__dataclass_fields__") else cfg)
            if y is not None:
                ref = h.float() @ ref_w[fmt].T
                row["rel_err"] = float((y.float() - ref).abs().max() / ref.abs().max())
            out.append(row)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dlrt.bench.quant_kernels",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--shapes", nargs="+", default=[f"{n}x{k}" for n, k in SDAR_8B],
                    help="weight shapes NxK")
    ap.add_argument("--configs", type=int, default=8,
                    help="candidate configs timed per Triton variant and shape")
    ap.add_argument("--out", default=BENCH_OUT,
                    help=f"folder for the JSON record (default: {BENCH_OUT})")
    return ap


def main(argv: list[str] | None = None) -> int:
    from dlrt.bench.step import copy_bandwidth

    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the quantised GEMM benchmark needs a CUDA GPU")
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    rows = []
    with torch.inference_mode():
        for shape in args.shapes:
            n, k = (int(v) for v in shape.lower().split("x"))
            shape_rows = bench_shape(n, k, tuple(args.rows), args.configs)
            for r in shape_rows:
                r["vs_copy"] = r["GBps"] * 1e9 / bw
                r["floor_us"] = r["MB"] * 1e6 / bw * 1e6
            print(table(shape_rows, COLUMNS[:-1]), flush=True)
            rows += shape_rows
    print(table(rows, COLUMNS[:-1]))
    path = write_json("quant-kernels", dict(copy_bandwidth_TBps=bw / 1e12, rows=rows), dev,
                      args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
