"""Sweep of the sampling kernel's layout on [4, 151936] bf16 logits: logits per block (BLOCK)
and blocks per program (CHUNKS), graph-replayed us per call. Prints a table; JSON to $OUT."""
import json
import os

import torch

from dlrt.kernels import sampling as ks
from dlrt.kernels.gemm_select import graph_us

n, v = 4, 151936
g = torch.Generator(device="cuda").manual_seed(0)
h = torch.randn(n, 2048, device="cuda", generator=g).bfloat16()
logits = h @ (torch.randn(v, 2048, device="cuda", generator=g) * 0.05).bfloat16().T
pos = torch.arange(100, 100 + n, device="cuda")
seed, rnd = torch.tensor(5, device="cuda"), torch.tensor(1, device="cuda")
rows = []
for spec in ((0.8, 50, 0.9), (1.0, 0, 0.95)):
    for block in (256, 512, 1024):
        for chunks in (1, 3, 5, 10, 20):
            ks.BLOCK, ks.CHUNKS = block, chunks
            slices, slice_len = ks._layout(v)
            us = graph_us(lambda s=spec: ks.sample_candidates(logits, *s, seed, rnd, pos))
            rows.append(dict(spec=str(spec), block=block, slices=slices, chunks=slice_len // block,
                             us=us))
            print(f"{spec} block={block:5d} slices/row={slices:4d} chunks={slice_len // block:3d}"
                  f" {us:8.1f} us", flush=True)
json.dump(dict(rows=rows, commit=os.environ.get("DLRT_COMMIT")),
          open(os.path.join(os.environ.get("OUT", "."), "sampling-sweep.json"), "w"), indent=1)
