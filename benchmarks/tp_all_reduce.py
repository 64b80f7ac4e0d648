"""The fused peer-to-peer all-reduce against NCCL's at a round's message sizes (CUDA, torchrun).

    torchrun --nproc-per-node 2 benchmarks/tp_all_reduce.py [--out DIR]

Per size: microseconds per call of each, both captured in a CUDA graph of CALLS back-to-back
calls and replayed (launch cost excluded, as inside a round), and eager NCCL for reference;
the p2p results are checked bit-identical on every rank. Rank 0 prints the table and writes
DIR/tp_all_reduce-<time>.json (default benchmarks/runs, ignored by git).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dlrt.distributed.p2p import P2PAllReduce

CALLS, REPS = 50, 20
# (what, shape, dtype): B = 4 rows of SDAR-1.7B / 8B hidden sums, the folded round's 2B rows,
# the greedy candidates' exchange (3 values x 2 ranks), the logits gathered for sampling
SIZES = [("hidden 1.7B", (4, 2048), torch.bfloat16), ("hidden 8B", (4, 4096), torch.bfloat16),
         ("hidden 8B, 2B rows", (8, 4096), torch.bfloat16),
         ("greedy exchange", (4, 6), torch.float32),
         ("logits gather", (4, 151936), torch.bfloat16)]


def graph_us(fn, x) -> float:
    """Microseconds per call of fn(x), CALLS calls captured in one graph, REPS replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPS * CALLS)


def eager_us(fn, x) -> float:
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(REPS * 5):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / (REPS * 5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/runs")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    p2p = P2PAllReduce(gloo, rank, world, torch.device("cuda", local), capacity_bytes=8 << 20)

    def nccl(x):
        dist.all_reduce(x)
        return x

    rows = []
    for what, shape, dtype in SIZES:
        gen = torch.Generator(device="cuda").manual_seed(rank)
        x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        got = p2p.all_reduce(x)
        every = [torch.empty_like(got) for _ in range(world)]
        dist.all_gather(every, got)
        same = all(torch.equal(e, every[0]) for e in every)
        rows.append(dict(message=what, shape=list(shape), dtype=str(dtype).split(".")[1],
                         bytes=x.numel() * x.element_size(),
                         p2p_graph_us=graph_us(p2p.all_reduce, x),
                         nccl_graph_us=graph_us(nccl, x.clone()),
                         nccl_eager_us=eager_us(nccl, x.clone()), same_on_ranks=same))
        rows[-1]["p2p_vs_nccl"] = rows[-1]["p2p_graph_us"] / rows[-1]["nccl_graph_us"]
    torch.cuda.synchronize()
    p2p.close()
    if rank == 0:
        cols = list(rows[0])
        print(" | ".join(cols))
        for r in rows:
            print(" | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r.values()))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"tp_all_reduce-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(dict(world=world, device=torch.cuda.get_device_name(),
                                        calls=CALLS, reps=REPS, rows=rows), indent=2))
        print(f"wrote {path}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
