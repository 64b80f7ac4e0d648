"""The routed MoE layer at given shapes: the Triton method against the PyTorch reference.

`bench_moe(n, E, k, H, I)` builds one `FusedMoE` with random weights on the GPU, routes n random
rows and times `route` and `apply` per call (replayed from a CUDA graph of `reps` calls, as in
the block graph; the reference's many-pairs path syncs with the host and is timed eagerly).
The floor is the touched experts' weights read once: bytes = touched * 3 * H * I * itemsize.

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
from dlrt.ops import get_ops
from dlrt.tuning.timing import event_us, graph_us

COLUMNS = ["shape", "form", "touched", "route_us", "apply_us", "reference_us", "GBps",
           "vs_copy"]
# (name, E, k, H, I, router) of the models whose rounds the kernels serve
MODELS = [("SDAR-30B-A3B", 128, 8, 2048, 768, RouterSpec("softmax", 128, 8)),
          ("LLaDA2.0-mini", 256, 8, 2048, 512,
           RouterSpec("sigmoid", 256, 8, n_group=8, topk_group=4, scaling=2.5))]


def bench_moe(n: int, num_experts: int, top_k: int, hidden: int, inter: int,
              dtype: torch.dtype = torch.bfloat16, spec: RouterSpec | None = None,
              config: MoEConfig | None = None, reps: int = 20, seed: int = 0) -> dict[str, Any]:
    """Time one MoE layer's routed experts at x [n, hidden] (see the module docstring).

    Returns a row: shape, form, touched experts, route_us / apply_us (Triton), reference_us
    (`ReferenceMoE.apply`), GBps (touched expert bytes / apply_us), max_abs_diff (Triton
    against the reference output).
    """
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
    nbytes = touched * 3 * hidden * inter * x.element_size()
    cfg = config or moe_config(n, top_k, num_experts, hidden, inter)
    return dict(shape=f"n={n},E={num_experts},k={top_k},H={hidden},I={inter}", form=cfg.form,
                touched=touched, route_us=route_us, apply_us=apply_us, reference_us=ref_us,
                GBps=nbytes / apply_us / 1e3,
                max_abs_diff=float((out.float() - ref.float()).abs().max()))


def main(rows=(1, 4, 8, 16, 32, 64, 256, 1024)) -> int:
    from dlrt.bench.step import copy_bandwidth

    if not torch.cuda.is_available():
        raise SystemExit("the MoE benchmark needs a CUDA GPU")
    bw = copy_bandwidth(torch.device("cuda"))
    out = []
    for name, e, k, h, i, spec in MODELS:
        for n in rows:
            r = bench_moe(n, e, k, h, i, spec=spec)
            out.append({**r, "shape": f"{name} {r['shape']}", "vs_copy": r["GBps"] * 1e9 / bw})
    print(table(out, COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
