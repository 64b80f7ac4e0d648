"""Host cost of one launch (µs, no sync) of each Triton kernel of a round and of cuBLAS, with
PDL as set by DLRT_PDL: the eager path pays it per kernel."""
import time

import torch
import torch.nn.functional as F

from dlrt.kernels.paged_attention import default_splits, paged_chunk_attention
from dlrt.kernels.rms_norm import rms_norm
from dlrt.kernels.skinny_gemm import GemmConfig, skinny_gemm

dev = torch.device("cuda")
x = torch.randn(4, 2048, device=dev, dtype=torch.bfloat16)
w = torch.randn(4096, 2048, device=dev, dtype=torch.bfloat16)
nw = torch.ones(2048, device=dev, dtype=torch.bfloat16)
kc = torch.randn(2600, 16, 8, 128, device=dev, dtype=torch.bfloat16)
q = torch.randn(4, 16, 128, device=dev, dtype=torch.bfloat16)
pt = torch.arange(2600, device=dev, dtype=torch.int32)
lens = torch.tensor([100, 104], device=dev, dtype=torch.int32)
splits = default_splits(41600, 4, 16, 8, dev)
ops = {
    "rms_norm": lambda: rms_norm(x, nw, 1e-6),
    "gemv": lambda: skinny_gemm(x, w, GemmConfig(8, 256, 1, stages=2, kind="fma")),
    "cublas": lambda: F.linear(x, w),
    "attention": lambda: paged_chunk_attention(q, kc, kc, pt, lens, 0.1, 4, 41600, splits),
}
for name, fn in ops.items():
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        fn()
    host = (time.perf_counter() - t) / 200 * 1e6
    torch.cuda.synchronize()
    print(f"launch {name:<10} {host:8.1f} us host per call")
