"""Does an L2 prefetch make a later GEMV read its weight from the L2? One bf16 weight [N, K],
4 rows: the GEMV (`torch.mm`) timed alone with CUDA events after the L2 was flushed (a 256 MiB
write), after each way of fetching the weight first, with a 30 us spin between (the prefetch
has time to land): a bulk prefetch kernel (`cp.async.bulk.prefetch.L2`, one per thread of 16
or 4 KiB; the form of the runtime kernel of 49e05e0, since removed), a per-line
`prefetch.global.L2` kernel, `prefetch.global.L2::evict_last`, and a real read of the weight (a
sum: the warm ceiling). Median of 30. Prints a table and writes JSON to argv[1]."""
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _bulk_prefetch(w_ptr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, SIZE: tl.constexpr):
    i = tl.minimum(tl.program_id(0) * 32 + tl.arange(0, 32), CHUNKS - 1)
    size = tl.full([32], SIZE, tl.int32)
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
        [w_ptr + i.to(tl.int64) * CHUNK, size], dtype=tl.int32, is_pure=False, pack=1)


def _bulk(w: torch.Tensor, chunk_bytes: int) -> None:
    chunks = w.numel() * 2 // chunk_bytes
    _bulk_prefetch[(triton.cdiv(chunks, 32),)](w, CHUNK=chunk_bytes // 2, CHUNKS=chunks,
                                               SIZE=chunk_bytes, num_warps=1)


@triton.jit
def _line_prefetch(w_ptr, LINES: tl.constexpr, HINT: tl.constexpr):
    i = tl.program_id(0) * 256 + tl.arange(0, 256)
    p = w_ptr + tl.minimum(i, LINES - 1).to(tl.int64) * 64  # 128-byte lines of bf16
    if HINT:
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
                                  "=r,l", [p], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p],
                                  dtype=tl.int32, is_pure=False, pack=1)


def _ways(w: torch.Tensor) -> dict:
    nbytes = w.numel() * 2
    grid = (triton.cdiv(nbytes // 128, 256),)
    return {
        "cold": lambda: None,
        "bulk16k": lambda: _bulk(w, 16384),
        "bulk4k": lambda: _bulk(w, 4096),
        "line": lambda: _line_prefetch[grid](w, LINES=nbytes // 128, HINT=False, num_warps=8),
        "line_evict_last": lambda: _line_prefetch[grid](w, LINES=nbytes // 128, HINT=True,
                                                        num_warps=8),
        "read": lambda: w.sum(),
    }


def main(out: str) -> None:
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    rows = []
    for n, k in ((2048, 2048), (12288, 2048), (4096, 4096), (6144, 4096)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
        nbytes = w.numel() * 2
        row = {"N": n, "K": k, "MiB": nbytes / 2**20}
        for name, fetch in _ways(w).items():
            times = []
            for _ in range(30):
                flush.fill_(1)
                fetch()
                torch.cuda._sleep(60000)  # ~30 us at 1.98 GHz
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.mm(x, w.t())
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            row[name] = statistics.median(times)
        rows.append(row)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)
    with open(f"{out}/prefetch-probe.json", "w") as f:
        json.dump({"commit": os.environ.get("DLRT_COMMIT"), "device": torch.cuda.get_device_name(),
                   "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
