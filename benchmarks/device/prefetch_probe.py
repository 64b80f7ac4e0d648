"""Does an L2 prefetch make a later GEMV read its weight from the L2? One bf16 weight [N, K],
4 rows: the GEMV (`torch.mm`) timed alone with CUDA events after the L2 was flushed (a 256 MiB
write), after each way of fetching the weight first, with a 30 us spin between (the prefetch
has time to land): the bulk prefetch kernel (`dlrt.kernels.l2_prefetch`), a per-line
`prefetch.global.L2` kernel, `prefetch.global.L2::evict_last`, and a real read of the weight (a
sum: the warm ceiling). Median of 30. Prints a table and writes JSON to argv[1]."""
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from dlrt.kernels import l2_prefetch


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
        "bulk16k": lambda: l2_prefetch.prefetch(w, nbytes, 16384),
        "bulk4k": lambda: l2_prefetch.prefetch(w, nbytes, 4096),
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
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
