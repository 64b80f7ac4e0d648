"""Device probe: the WHILE-node block graph (dlrt.runtime.cuda_while) and the Triton paged
attention kernel on the GPU, checked against references and timed. Prints a short table."""

import time

import torch
import torch.nn.functional as F

from dlrt.kernels.paged_attention import paged_chunk_attention
from dlrt.runtime.cuda_while import WhileGraph

dev = torch.device("cuda")
rows = []

# 1. WHILE graph: begin sets counter=0, body does one matmul round and counts to `limit`.
W = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) / 64
h = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
counter = torch.zeros(1, dtype=torch.int32, device=dev)
limit = torch.full((1,), 100, dtype=torch.int32, device=dev)
flag = torch.zeros(1, dtype=torch.int32, device=dev)
ends = torch.zeros(1, dtype=torch.int32, device=dev)


def begin():
    counter.zero_()
    flag.copy_((counter < limit).int())


def body():
    h.copy_(torch.tanh(h @ W))
    counter.add_(1)
    flag.copy_((counter < limit).int())


def end():
    ends.add_(1)


s = torch.cuda.Stream()
with torch.cuda.stream(s):
    body(); begin(); end()  # warm up cuBLAS outside capture
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    wg = WhileGraph(begin, body, end, flag)
    build_s = time.perf_counter() - t0
    ends.zero_()
    wg.launch(); torch.cuda.synchronize()
    ok = counter.item() == 100 and ends.item() == 1
    rows.append(("while graph 100 rounds: counter, end ran once", ok, build_s))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for trial in range(3):
        e0.record(); wg.launch(); e1.record(); torch.cuda.synchronize()
        t_while = e0.elapsed_time(e1) * 1e3 / 100
        e0.record()
        for _ in range(100):
            g.replay()
        e1.record(); torch.cuda.synchronize()
        t_replay = e0.elapsed_time(e1) * 1e3 / 100
        t0 = time.perf_counter()
        for _ in range(100):
            g.replay(); flag.item()
        t_host = (time.perf_counter() - t0) * 1e6 / 100
    rows.append(("round us: while / replay / replay+sync", f"{t_while:.1f} / {t_replay:.1f} / "
                 f"{t_host:.1f}", t_while - t_replay))
    limit.fill_(7); wg.launch(); torch.cuda.synchronize()
    rows.append(("relaunch with limit 7", counter.item() == 7, 0.0))

# 2. Triton paged attention vs SDPA (bf16), SDAR-8B heads.
def ref(q, kc, vc, pt, start, kv_len, cb):
    n, hq, d = q.shape
    ps, hkv = kc.shape[1], kc.shape[2]
    pos = torch.arange(kv_len, device=dev)
    slots = pt[pos // ps].long() * ps + pos % ps
    k = kc.reshape(-1, hkv, d)[slots].repeat_interleave(hq // hkv, 1)
    v = vc.reshape(-1, hkv, d)[slots].repeat_interleave(hq // hkv, 1)
    qi = torch.arange(n, device=dev)[:, None]
    kj = torch.arange(kv_len, device=dev)[None, :]
    m = (kj < start) | ((kj - start) // cb <= qi // cb)
    return F.scaled_dot_product_attention(q.transpose(0, 1).float(), k.transpose(0, 1).float(),
                                          v.transpose(0, 1).float(), attn_mask=m,
                                          scale=d ** -0.5).transpose(0, 1)

for ctx in (0, 1000, 4096, 32764):
    pages, ps = 2048 + 1, 16
    kc = torch.randn(pages, ps, 8, 128, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    pt = torch.randperm(pages, device=dev).to(torch.int32)
    q = torch.randn(4, 32, 128, device=dev, dtype=torch.bfloat16)
    lens = torch.tensor([ctx, ctx + 4], dtype=torch.int32, device=dev)
    out = paged_chunk_attention(q, kc, vc, pt, lens, 128 ** -0.5, 4, max_kv=32768, split=512)
    r = ref(q, kc, vc, pt, ctx, ctx + 4, 4)
    err = ((out.float() - r).norm() / r.norm()).item()
    t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        paged_chunk_attention(q, kc, vc, pt, lens, 128 ** -0.5, 4, max_kv=32768, split=512)
    torch.cuda.synchronize(); t[0].record()
    for _ in range(50):
        paged_chunk_attention(q, kc, vc, pt, lens, 128 ** -0.5, 4, max_kv=32768, split=512)
    t[1].record(); torch.cuda.synchronize()
    us = t[0].elapsed_time(t[1]) * 1e3 / 50
    kv_bytes = 2 * (ctx + 4) * 8 * 128 * 2
    rows.append((f"paged attn ctx={ctx}: rel err, us, GB/s", f"{err:.2e}", f"{us:.1f} us "
                 f"{kv_bytes / us / 1e3:.0f} GB/s"))
print("\n".join(f"{a:55s} {b!s:25s} {c!s}" for a, b, c in rows))
