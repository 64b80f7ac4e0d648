"""The fused sampling draw on [4, 151936] bf16 logits: graph-replayed time per call for each
filter combination and block/warps setting, the reference draw in the same run, and the
per-kernel times of one call (torch.profiler). Prints a table; JSON to $OUT."""
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from dlrt.decoding.sampling import SamplingSpec, candidates, probabilities
from dlrt.kernels import sampling as ks
from dlrt.kernels.gemm_select import graph_us
from dlrt.kernels.greedy import greedy_candidates

n, v = 4, 151936
g = torch.Generator(device="cuda").manual_seed(0)
h = torch.randn(n, 2048, device="cuda", generator=g).bfloat16()
head = (torch.randn(v, 2048, device="cuda", generator=g) * 0.05).bfloat16()
logits = h @ head.T
pos = torch.arange(100, 100 + n, device="cuda")
seed, rnd = torch.tensor(5, device="cuda"), torch.tensor(1, device="cuda")
rows = []
specs = [(0.8, 50, 0.9), (1.0, 0, 0.95), (0.8, 50, 1.0), (1.0, 0, 1.0)]
for t, k, p in specs:
    spec = SamplingSpec(t, k, p, 5)
    ref = graph_us(lambda s=spec: candidates(probabilities(logits, s), s, 1, pos, seed), reps=5)
    for block, warps in ((512, 4), (512, 8)):
        ks.BLOCK, ks.NUM_WARPS = block, warps
        us = graph_us(lambda a=(t, k, p): ks.sample_candidates(logits, *a, seed, rnd, pos))
        ids, _ = ks.sample_candidates(logits, t, k, p, seed, rnd, pos)
        rid, _ = candidates(probabilities(logits, spec), spec, 1, pos, seed)
        rows.append(dict(spec=f"T{t},k{k},p{p}", block=block, warps=warps, kernel_us=us,
                         reference_us=ref, same_ids=bool(torch.equal(ids, rid))))
for r in rows:
    print(f"{r['spec']:18s} block={r['block']:4d} warps={r['warps']} kernel={r['kernel_us']:8.1f}"
          f" us  reference={r['reference_us']:8.1f} us  same_ids={r['same_ids']}", flush=True)
ks.BLOCK, ks.NUM_WARPS = 512, 4
greedy = graph_us(lambda: greedy_candidates(logits))
print(f"greedy kernels (2 launches): {greedy:.1f} us")
for _ in range(3):
    ks.sample_candidates(logits, 0.8, 50, 0.9, seed, rnd, pos)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        ks.sample_candidates(logits, 0.8, 50, 0.9, seed, rnd, pos)
    torch.cuda.synchronize()
kern = []
for e in prof.key_averages():
    us = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
    if us > 0:
        kern.append((e.key, us / 10, e.count / 10))
        print(f"  {e.key[:60]:60s} {us / 10:8.1f} us per call, {e.count / 10:.0f} launches")
json.dump(dict(rows=rows, greedy_us=greedy, kernels=kern, commit=os.environ.get("DLRT_COMMIT")),
          open(os.path.join(os.environ.get("OUT", "."), "sampling-profile.json"), "w"), indent=1)
sys.exit(0)
