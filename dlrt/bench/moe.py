"""The routed MoE layer at given shapes: the Triton method against the PyTorch reference.

`bench_moe(n, E, k, H, I)` builds one `FusedMoE` with random weights on the GPU, routes n random
rows and times `route` and `apply` per call (replayed from a CUDA graph of `reps` calls, as in
the block graph; the reference's many-pairs path syncs with the host and is timed eagerly).
The floor is the touched experts' weights read once: bytes = touched * 3 * H * I * itemsize;
with `quantization="fp8"` (the experts held as 128 x 128 block-scaled float8_e4m3fn, read as
FP8 by the kernels) the FP8 floor: one byte per weight plus the touched experts' fp32 block
scales.

    python -m dlrt.bench.moe                       # SDAR-30B-A3B and LLaDA2.0-mini shapes
    python -c "from dlrt.bench.moe import bench_moe; print(bench_moe(4, 128, 8, 2048, 768))"
"""

from __future__ import annotations

from typing import Any

import torch

from dlrt.bench.report import table
from dlrt.kernels.moe import MoEConfig, moe_config
from dlrt.layers.moe import FusedMoE
from dlrt.layers.moe.base import RouterSpec
from dlrt.layers.moe.reference import ReferenceMoE
from dlrt.layers.moe.triton import TritonMoE
from dlrt.layers.quant.convert import quantize_experts
from dlrt.layers.quant.fp8 import FP8_FORMAT
from dlrt.ops import get_ops
from dlrt.tuning.timing import event_us, graph_us

COLUMNS = ["shape", "form", "touched", "route_us", "apply_us", "reference_us", "floor_MB",
           "GBps", "vs_copy"]
# (name, E, k, H, I, router) of the models whose rounds the kernels serve
MODELS = [("SDAR-30B-A3B", 128, 8, 2048, 768, RouterSpec("softmax", 128, 8)),
          ("LLaDA2.0-mini", 256, 8, 2048, 512,
           RouterSpec("sigmoid", 256, 8, n_group=8, topk_group=4, scaling=2.5))]


def bench_moe(n: int, num_experts: int, top_k: int, hidden: int, inter: int,
              dtype: torch.dtype = torch.bfloat16, spec: RouterSpec | None = None,
              config: MoEConfig | None = None, reps: int = 20, seed: int = 0,
              quantization: str | None = None) -> dict[str, Any]:
    """Time one MoE layer's routed experts at x [n, hidden] (see the module docstring).

    quantization: None (experts in `dtype`) or "fp8" (quantised from the random weights; needs
    I a multiple of 128, so that the kernels read the block layout).
    Returns a row: shape, form, touched experts, route_us / apply_us (Triton), reference_us
    (`ReferenceMoE.apply`), GBps (touched expert bytes at the floor / apply_us), floor_MB,
    max_abs_diff (Triton against the reference output).
    """
    if quantization not in (None, "fp8"):
        raise ValueError(f"bench_moe: quantization must be None or 'fp8', got {quantization!r}")
    dev = torch.device("cuda")
    spec = spec or RouterSpec("softmax", num_experts, top_k)
    torch.manual_seed(seed)
    layer = FusedMoE(hidden, inter, spec, get_ops("triton")).to(dev)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.02)
    layer.to(dtype)
    if spec.scoring == "sigmoid":  # the sigmoid router keeps fp32 parameters (as at load)
        layer.gate.float()
    if quantization == "fp8":
        if inter % 128:
            raise ValueError(f"bench_moe: fp8 experts need I a multiple of 128, got {inter}")
        quantize_experts(layer.experts, FP8_FORMAT)
    method = TritonMoE() if config is None else TritonMoE(lambda *_: config)
    x = torch.randn(n, hidden, dtype=dtype, device=dev)
    with torch.inference_mode():
        weights, ids = method.route(layer, x)
        touched = int(torch.unique(ids).numel())
        ref_method = ReferenceMoE()
        ref = ref_method.apply(layer, x, weights, ids)
        out = method.apply(layer, x, weights, ids)
        route_us = graph_us(lambda: method.route(layer, x), reps)
        apply_us = graph_us(lambda: method.apply(layer, x, weights, ids), reps)
        capturable = n * top_k <= ReferenceMoE.GATHER_PAIRS_PER_EXPERT * num_experts
        timer = graph_us if capturable else event_us
        ref_us = timer(lambda: ref_method.apply(layer, x, weights, ids), reps)
    nbytes = expert_bytes(touched, hidden, inter, x.element_size(), quantization)
    cfg = config or moe_config(n, top_k, num_experts, hidden, inter)
    shape = f"n={n},E={num_experts},k={top_k},H={hidden},I={inter}"
    return dict(shape=shape if quantization is None else f"{shape},{quantization}",
                form=cfg.form, touched=touched, route_us=route_us, apply_us=apply_us,
                reference_us=ref_us, GBps=nbytes / apply_us / 1e3, floor_MB=nbytes / 1e6,
                max_abs_diff=float((out.float() - ref.float()).abs().max()))


def expert_bytes(touched: int, hidden: int, inter: int, itemsize: int,
                 quantization: str | None = None) -> int:
    """The floor: the touched experts' weights read once (fp8: one byte per weight plus the
    fp32 128 x 128 block scales of w13 and w2)."""
    if quantization != "fp8":
        return touched * 3 * hidden * inter * itemsize
    hb, ib = -(-hidden // 128), -(-inter // 128)
    return touched * (3 * hidden * inter + 4 * (-(-2 * inter // 128) * hb + hb * ib))


def main(rows=(1, 4, 8, 16, 32, 64, 256, 1024), quantizations=(None, "fp8")) -> int:
    from dlrt.bench.step import copy_bandwidth

    if not torch.cuda.is_available():
        raise SystemExit("the MoE benchmark needs a CUDA GPU")
    bw = copy_bandwidth(torch.device("cuda"))
    out = []
    for name, e, k, h, i, spec in MODELS:
        for n, quant in ((n, q) for q in quantizations for n in rows):
            r = bench_moe(n, e, k, h, i, spec=spec, quantization=quant)
            out.append({**r, "shape": f"{name} {r['shape']}", "vs_copy": r["GBps"] * 1e9 / bw})
    print(table(out, COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
