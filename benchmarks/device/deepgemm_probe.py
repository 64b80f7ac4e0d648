"""DeepGEMM's BF16 GEMM (`deep_gemm.bf16_gemm_nt`, sgl-deep-gemm) at 4 rows against cuBLAS
(`torch.mm`) on the SDAR projection shapes, in the same process: each call streams its weight
from HBM (copies larger than the L2), timed as graph replays (`dlrt.kernels.gemm_select`).
Checked against an fp32 product first. Usage: python deepgemm_probe.py OUT_DIR"""
import json
import sys
import time
from pathlib import Path

import torch

from dlrt import env
from dlrt.bench.report import device_name
from dlrt.kernels.gemm_select import _copies, graph_us

SHAPES = {"8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate-up": (24576, 4096),
          "8B down": (4096, 12288), "1.7B qkv": (4096, 2048), "1.7B o": (2048, 2048)}
BW = 4.2e12  # bytes/s, the floor used by the other probes


def per_call(fn, copies):
    return graph_us(lambda: [fn(w) for w in copies], reps=4) / len(copies)


def main(out: Path) -> None:
    import deep_gemm
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(4, n, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ w.float().T
        row = {"shape": name, "n": n, "k": k, "floor_us": n * k * 2 / BW * 1e6}
        copies = [c for (c,) in _copies((w,), most=15)]
        row["cublas_us"] = per_call(lambda wc, x=x: torch.mm(x, wc.T), copies)
        try:
            t0 = time.time()
            deep_gemm.bf16_gemm_nt(x, w, y)
            torch.cuda.synchronize()
            row["jit_s"] = time.time() - t0
            row["rel_err"] = ((y.float() - ref).norm() / ref.norm()).item()
            row["deepgemm_us"] = per_call(
                lambda wc, x=x, y=y: deep_gemm.bf16_gemm_nt(x, wc, y), copies)
        except Exception as e:  # an unsupported shape or a failed JIT build: record it
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'shape':<12} {'floor':>7} {'cuBLAS':>7} {'DeepGEMM':>9} {'rel err':>8}")
    for r in rows:
        dg = f"{r['deepgemm_us']:9.1f}" if "deepgemm_us" in r else f"{'error':>9}"
        err = f"{r['rel_err']:8.1e}" if "rel_err" in r else ""
        print(f"{r['shape']:<12} {r['floor_us']:7.1f} {r['cublas_us']:7.1f} {dg} {err}")
    rec = {"commit": env.commit(), "device": device_name(torch.device("cuda")),
           "command": " ".join(sys.argv),
           "deep_gemm": deep_gemm.__version__, "rows": 4,
           "results": rows}
    (out / "deepgemm-probe.json").write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
