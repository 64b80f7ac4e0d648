"""Launch sweeps of the FP8 kernels against their BF16 forms, one process, one GPU.

  attention: `paged_chunk_attention`'s split kernel at SDAR-8B's heads (32 q / 8 KV, D 128,
      pages of 16), a block of 4 queries at a given context, BF16 and FP8 caches; per launch
      (block_n, warps, stages, splits): microseconds per call (4 layers' caches in turn, so
      the KV does not stay in L2), GB/s of the KV read, and the largest difference from the
      default launch's output.
  moe: the routed experts of one SDAR-30B-A3B MoE layer (E 128, top-8, H 2048, I 768) for
      n rows, BF16 and FP8 experts, per `MoEConfig`.

    python benchmarks/device/sweep_fp8.py attention --context 32000 --out OUT.json
    python benchmarks/device/sweep_fp8.py moe --rows 4 --out OUT.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import torch

from dlrt.bench.report import table
from dlrt.kernels import paged_attention as pa
from dlrt.tuning.timing import graph_us


def attention(context: int, budget_s: float, page: int = 16) -> list[dict]:
    dev = torch.device("cuda")
    h_q, h_kv, d, n, layers = 32, 8, 128, 4, 4
    max_kv = context + 64
    pages = -(-max_kv // page)
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(n, h_q, d, device=dev, generator=gen).bfloat16()
    caches = {}
    for name in ("bf16", "fp8"):
        kv = []
        for _ in range(layers):
            k = torch.randn(pages, page, h_kv, d, device=dev, generator=gen)
            v = torch.randn(pages, page, h_kv, d, device=dev, generator=gen)
            dt = torch.bfloat16 if name == "bf16" else torch.float8_e4m3fn
            kv.append((k.to(dt), v.to(dt)))
        caches[name] = kv
    table_ = torch.arange(pages, dtype=torch.int32, device=dev)
    lens = torch.tensor([context, context + n], dtype=torch.int32, device=dev)
    one = torch.ones((), device=dev)
    scale = 1 / math.sqrt(d)
    base = pa.default_splits(max_kv, n, h_q, h_kv, dev)
    rows, ref = [], {}
    t0 = time.time()

    def run(name, splits, **launch):
        scratch = pa.split_scratch(n, h_q, d, splits, dev)
        outs = [torch.empty_like(q) for _ in range(layers)]

        def call():
            for (k, v), o in zip(caches[name], outs, strict=True):
                pa._launch(q, k, v, table_, lens, scale, 4, max_kv, splits, o, scratch,
                           one if name == "fp8" else None, one if name == "fp8" else None,
                           **launch)
        us = graph_us(call, reps=10) / layers
        return us, outs[0].float()

    variants = [(name, s, dict(block_n=b, warps=w, stages=st))
                for name in ("fp8", "bf16") for w in (1, 2, 4) for b in (64, 128, 32)
                for s in (base, 2 * base, 4 * base) for st in (2, 3)]
    kv_bytes = {name: 2 * (context + n) * h_kv * d * (2 if name == "bf16" else 1)
                for name in caches}
    for name, splits, launch in variants:
        if time.time() - t0 > budget_s:
            break
        try:
            us, out = run(name, splits, **launch)
        except Exception as exc:  # a launch that does not fit (shared memory) is reported
            rows.append(dict(kv=name, splits=splits, **launch, us=None, error=str(exc)[:80]))
            continue
        key = name
        ref.setdefault(key, out)
        rows.append(dict(kv=name, splits=splits, **launch, us=round(us, 2),
                         GBps=round(kv_bytes[name] / us / 1e3),
                         diff=float((out - ref[key]).abs().max())))
    print(table(rows, ["kv", "splits", "block_n", "warps", "stages", "us", "GBps", "diff"]))
    return rows


def moe(n: int, budget_s: float) -> list[dict]:
    from dlrt.bench.moe import expert_bytes
    from dlrt.kernels.moe import MoEConfig, moe_config
    from dlrt.layers.moe import FusedMoE
    from dlrt.layers.moe.base import RouterSpec
    from dlrt.layers.moe.triton import TritonMoE
    from dlrt.layers.quant.convert import quantize_experts
    from dlrt.layers.quant.fp8 import FP8_FORMAT
    from dlrt.ops import get_ops

    dev = torch.device("cuda")
    e, k, h, i = 128, 8, 2048, 768
    spec = RouterSpec("softmax", e, k)
    torch.manual_seed(0)
    layers = {}
    for name in ("bf16", "fp8"):
        layer = FusedMoE(h, i, spec, get_ops("triton")).to(dev)
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_(0.0, 0.02)
        layer.to(torch.bfloat16)
        if name == "fp8":
            quantize_experts(layer.experts, FP8_FORMAT)
        layers[name] = layer
    x = torch.randn(n, h, dtype=torch.bfloat16, device=dev)
    default = moe_config(n, k, e, h, i)
    configs = [("bf16", default), ("fp8", default)]
    configs += [("fp8", MoEConfig(default.form, block_m=default.block_m, up_n=bn, up_k=128,
                                  down_n=bn, down_k=128, warps=4, stages=st, unroll=u))
                for bn in (64, 128) for u in (1, 2, 4) for st in (3, 2)]
    rows, ref = [], {}
    t0 = time.time()
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        weights, _ = TritonMoE().route(layers["bf16"], x)
        routings = {}  # the pairs spread over `spread` experts (k: every row picks the same k)
        for spread in (k, 2 * k, 4 * k):
            subset = torch.randperm(e, generator=gen)[:spread]
            routings[spread] = torch.stack([subset[torch.randperm(spread, generator=gen)[:k]]
                                            for _ in range(n)]).to(dev)
        for (name, cfg), spread in itertools.product(configs, routings):
            if time.time() - t0 > budget_s:
                break
            ids = routings[spread]
            touched = int(torch.unique(ids).numel())
            name_t = f"{name}/{spread}"
            layer = layers[name]
            method = TritonMoE(lambda *_, c=cfg: c)
            try:
                out = method.apply(layer, x, weights, ids).float()
                us = graph_us(lambda m=method, ly=layer, i=ids: m.apply(ly, x, weights, i), reps=20)
            except Exception as exc:
                rows.append(dict(experts=name_t, **vars(cfg), us=None, error=str(exc)[:80]))
                continue
            ref.setdefault(name_t, out)
            nbytes = expert_bytes(touched, h, i, 2, "fp8" if name == "fp8" else None)
            rows.append(dict(experts=name_t, **vars(cfg), us=round(us, 2),
                             GBps=round(nbytes / us / 1e3), touched=touched,
                             diff=float((out - ref[name_t]).abs().max())))
    rows.sort(key=lambda r: (r["experts"], r.get("touched", 0)))
    print(table(rows, ["experts", "form", "block_m", "up_n", "up_k", "down_n", "warps",
                       "stages", "unroll", "us", "GBps", "touched", "diff"]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["attention", "moe"])
    ap.add_argument("--context", type=int, default=32000)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of sweeping")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = (attention(args.context, args.budget) if args.what == "attention"
            else moe(args.rows, args.budget))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
