"""A hand-written CUDA GEMV (gemv_probe.cu, several warps / rows-per-warp / vectors-in-flight
variants) against cuBLAS (`torch.mm`) and dlrt's Triton GEMM with the config the load-time
choice picked, at 4 bf16 rows on the SDAR-1.7B and SDAR-8B projection shapes. Each is checked
against an fp32 reference, then timed as one launch per weight copy inside a CUDA graph (the
copies together exceed the L2, so every launch reads its weight from HBM), replayed 20 times.
argv: cubin path, output folder. Prints a table; writes gemv-probe.json."""
import ctypes
import json
import math
import os
import sys

import torch

from dlrt.kernels.skinny_gemm import GemmConfig, skinny_gemm
from dlrt.runtime.graphs import _check

VARIANTS = [(4, 1, 4), (4, 1, 8), (4, 2, 2), (4, 2, 4), (4, 4, 2), (8, 2, 2), (8, 2, 4),
            (8, 4, 2), (2, 4, 4)]
SHAPES = {"1.7B": [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144)],
          "8B": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]}
STEPS = {"1.7B": "benchmarks/results/step-SDAR-1.7B-Chat-20261130-211811.json",
         "8B": "benchmarks/results/step-SDAR-8B-Chat-20261130-212009.json"}


def graph_us(launch, copies, reps=20):
    """Per-launch time of `launch(i)` for i over the weight copies, captured in one graph."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(copies):  # warm up (Triton compiles) outside the capture
            launch(i)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for i in range(copies):
            launch(i)
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (reps * copies)


def main(cubin: str, out: str) -> None:
    from cuda.bindings import driver
    torch.zeros(1, device="cuda")  # the primary context the driver calls use
    module = _check(driver.cuModuleLoadData(open(cubin, "rb").read()))
    funcs = {v: _check(driver.cuModuleGetFunction(module, f"gemv_w{v[0]}_r{v[1]}_u{v[2]}"
                                                  .encode())) for v in VARIANTS}

    def cuda_gemv(v, x, w, y):
        n, k = w.shape
        warps, r, _ = v
        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        args = ((x.data_ptr(), w.data_ptr(), y.data_ptr(), n, k),
                (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int))
        _check(driver.cuLaunchKernel(funcs[v], math.ceil(n / (warps * r)), 1, 1, warps * 32, 1,
                                     1, 0, stream, args, 0))

    rows = []
    for model, shapes in SHAPES.items():
        chosen = json.load(open(STEPS[model]))["projections"]
        for n, k in shapes:
            nbytes = n * k * 2
            copies = max(2, min(16, math.ceil(512 * 2**20 / nbytes)))
            torch.manual_seed(0)
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 32
                  for _ in range(copies)]
            x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(4, n, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ ws[0].float().t()
            row = {"model": model, "N": n, "K": k, "MiB": nbytes / 2**20}
            row["cublas"] = graph_us(lambda i: torch.mm(x, ws[i].t(), out=y), copies)  # noqa: B023
            c = chosen.get(f"{n},{k}", {}).get("config")
            if c:
                cfg = GemmConfig(**c)
                err = (skinny_gemm(x, ws[0], cfg).float() - ref).abs().max().item()
                row["triton"] = graph_us(lambda i: skinny_gemm(x, ws[i], cfg), copies)  # noqa: B023
                row["triton_err"] = err
            for v in VARIANTS:
                y.zero_()
                cuda_gemv(v, x, ws[0], y)
                torch.cuda.synchronize()
                err = (y.float() - ref).abs().max().item()
                scale = ref.abs().max().item()
                name = "w{}r{}u{}".format(*v)
                row[name + "_err"] = err / scale
                row[name] = graph_us(lambda i: cuda_gemv(v, x, ws[i], y), copies)  # noqa: B023
            best = min((key for key in row if key.startswith("w") and not key.endswith("_err")),
                       key=lambda key: row[key])
            row["best"] = best
            row["floor_4.2TBps"] = nbytes / 4.2e12 * 1e6
            rows.append(row)
            worst = max(row[key] for key in row if key.endswith("_err") and key.startswith("w"))
            print(f"{model:<5} {n:>6}x{k:<6} {row['MiB']:6.1f} MiB  floor "
                  f"{row['floor_4.2TBps']:6.1f}  cublas {row['cublas']:6.1f}  triton "
                  f"{row.get('triton', float('nan')):6.1f}  best cuda {best} {row[best]:6.1f} "
                  f"(err {row[best + '_err']:.1e})  max err {worst:.1e}", flush=True)
    with open(f"{out}/gemv-probe.json", "w") as f:
        json.dump({"commit": os.environ.get("DLRT_COMMIT"), "device": torch.cuda.get_device_name(),
                   "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
