"""`dlrt bench kernels`: the fused small-op kernels and the projections at one model's shapes.

Every op runs at the round's shapes (N = block length rows) inside a CUDA graph that calls it
`reps` times; the graph is replayed and the time per call taken from CUDA events, so launch
overhead is excluded the way it is in the block graph. Small ops are compared with the
unfused PyTorch reference and with `torch.compile` of that reference, in the same run; so are
the round's candidate draws over the vocabulary (greedy, and sampling with temperature, top-k
and top-p: the fused kernels against `dlrt.decoding.sampling`).
Projections: cuBLAS (`F.linear`) against the skinny Triton GEMM for every weight shape, as
timed when the model was loaded (`dlrt.tuning.linear`), with the achieved bandwidth
(weight bytes read / time) against the copy bandwidth of `bench step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dlrt.bench.report import table, write_json
from dlrt.errors import OptionError
from dlrt.tuning.timing import graph_us

COLUMNS = ["op", "shape", "impl", "us", "vs_reference", "GBps"]


def small_ops(config, n: int, dtype, dev, kv_dtype=None
              ) -> dict[str, dict[str, Callable[[], Any]]]:
    """op name -> {impl: closure} over fresh random inputs at the model's shapes; the K/V
    write into a cache of `kv_dtype` (default: `dtype`; FP8: "qk_norm_rope_write+fp8")."""
    from dlrt.attention.kv_cache import PagedKVCache
    from dlrt.decoding.sampling import SamplingMode, SamplingSpec, candidates, probabilities
    from dlrt.layers.rotary import RotaryEmbedding
    from dlrt.ops import reference, triton

    c, h, d = config, config.hidden_size, config.head_dim
    hq, hkv = c.num_heads, c.num_kv_heads
    x = torch.randn(n, h, dtype=dtype, device=dev)
    res = torch.randn(n, h, dtype=dtype, device=dev)
    norm_w = torch.ones(h, dtype=dtype, device=dev)

    def norm_ref(x, res):
        return reference.add_rms_norm(x, res, norm_w, c.rms_norm_eps)

    gu = torch.randn(n, 2 * c.intermediate_size, dtype=dtype, device=dev)

    def silu_ref(gu):
        return reference.silu_and_mul(gu)

    qkv = torch.randn(n, (hq + 2 * hkv) * d, dtype=dtype, device=dev)
    cache = PagedKVCache(1, hkv, d, 4096, kv_dtype or dtype, dev)
    pos = torch.arange(1000, 1000 + n, device=dev)
    rotary = RotaryEmbedding(d, c.rope_theta).to(dev)
    cos, sin = rotary.cos_sin(pos)
    qn = kn = torch.ones(d, dtype=dtype, device=dev)
    rope_args = (hq, hkv, d, qn, kn, c.rms_norm_eps)
    rope_cache = (cache.k[0], cache.v[0], cache.page_table, False, *cache.scales(0))
    rope_name = "qk_norm_rope_write" + ("+fp8" if cache.quantized else "")

    def rope_ref(qkv, cos, sin):
        return reference.qk_norm_rope_write(qkv, *rope_args, cos, sin, pos, *rope_cache)

    logits = torch.randn(n, c.vocab_size, dtype=dtype, device=dev) * 3
    sample_specs = {"greedy": SamplingSpec(0.0, 0, 1.0, 1),
                    "sample T0.8,k50,p0.9": SamplingSpec(0.8, 50, 0.9, 1),
                    "sample T1,p0.95": SamplingSpec(1.0, 0, 0.95, 1)}

    # from device memory, as in the block graph
    seed, round_idx = torch.tensor(1, device=dev), torch.tensor(2, device=dev)

    def draw_ref(logits, spec):
        return candidates(probabilities(logits, spec), spec, round_idx, pos, seed)

    def draw(logits, spec):
        spec = SamplingSpec(spec.temperature, spec.top_k, spec.top_p, seed)
        return triton.candidates(logits, spec, SamplingMode.of(spec), round_idx, pos)

    compiled = {f: torch.compile(f, dynamic=False)
                for f in (norm_ref, silu_ref, rope_ref, draw_ref)}
    draws = {f"{name} [{n},{c.vocab_size}]": dict(
        triton=lambda spec=spec: draw(logits, spec),
        reference=lambda spec=spec: draw_ref(logits, spec),
        compiled=lambda spec=spec: compiled[draw_ref](logits, spec))
        for name, spec in sample_specs.items()}
    return draws | {
        f"rms_norm+residual [{n},{h}]": dict(
            triton=lambda: triton.add_rms_norm(x, res, norm_w, c.rms_norm_eps),
            reference=lambda: norm_ref(x, res), compiled=lambda: compiled[norm_ref](x, res)),
        f"silu_mul [{n},{2 * c.intermediate_size}]": dict(
            triton=lambda: triton.OPS.silu_and_mul(gu), reference=lambda: silu_ref(gu),
            compiled=lambda: compiled[silu_ref](gu)),
        f"{rope_name} [{n},{hq}+{hkv}x{d}]": dict(
            triton=lambda: triton.qk_norm_rope_write(qkv, *rope_args, cos, sin, pos,
                                                     *rope_cache),
            reference=lambda: rope_ref(qkv, cos, sin),
            compiled=lambda: compiled[rope_ref](qkv, cos, sin)),
    }


def run(llm, n: int) -> list[dict[str, Any]]:
    rows = []
    for op, impls in small_ops(llm.config, n, llm.dtype, llm.device,
                               llm.kv_cache.dtype).items():
        ref = graph_us(impls["reference"])
        for impl, fn in impls.items():
            try:
                us = graph_us(fn)
            except Exception as e:  # torch.compile cannot build every reference
                if impl != "compiled":
                    raise
                print(f"{op}: torch.compile failed ({type(e).__name__}); no compiled row")
                continue
            name, shape = op.rsplit(" ", 1)
            rows.append(dict(op=name, shape=shape, impl=impl, us=us, vs_reference=ref / us,
                             GBps=None))
    item = torch.empty((), dtype=llm.dtype).element_size()
    for shape, rec in llm.linear_plan.records.items():
        if "cublas_us" not in rec:  # a quantised shape: `bench step` prints its candidates
            continue
        nbytes = item * int(shape.split(",")[0]) * int(shape.split(",")[1])
        for impl in ("cublas", "triton"):
            us = rec[f"{impl}_us"]
            if us is None:
                continue
            # times include the feeding norm (as in a layer); the bandwidth is over the rest,
            # an upper bound under PDL, where the GEMV's first weight loads overlap the norm
            alone = us - rec.get("norm_us", 0.0)
            rows.append(dict(op="projection", shape=f"[{shape}]", impl=impl, us=us,
                             vs_reference=rec["cublas_us"] / us, GBps=nbytes / alone / 1e3,
                             config=rec["config"] if impl == "triton" else None))
    return rows


def main(args, llm_kwargs: dict[str, Any]) -> int:
    from dlrt import LLM
    from dlrt.bench.step import copy_bandwidth

    if not torch.cuda.is_available():
        raise OptionError("dlrt bench kernels needs a CUDA GPU")
    llm = LLM(**{**llm_kwargs, "max_model_len": 4096, "kernels": "triton"})
    if not llm.linear_plan.records:
        raise OptionError("--linear-kernels cublas: projection timing is off")
    with torch.inference_mode():
        rows = run(llm, args.rows)
    bw = copy_bandwidth(llm.device)
    for r in rows:
        r["GBps_vs_copy"] = r["GBps"] * 1e9 / bw if r["GBps"] else None
    print(table(rows, COLUMNS + ["GBps_vs_copy"]))
    model = llm.engine_config.model
    name = f"kernels-{str(model).rstrip('/').split('/')[-1]}"
    path = write_json(name, dict(model=str(model), dtype=str(llm.dtype), rows_n=args.rows,
                                 copy_bandwidth_TBps=bw / 1e12, rows=rows), llm.device, args.out)
    print(f"wrote {path}")
    return 0
