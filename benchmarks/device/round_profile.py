"""Where a round's time goes, kernel by kernel: a dummy-weight model (argv[1]) decodes a short
greedy request (block 4) under torch.profiler (CUPTI), in the device loop and then the host
loop; over every kernel recorded: GPU busy time (union of kernel intervals) against the span from
the first to the last kernel, the gaps between consecutive kernels, and the time per kernel
group (projections, attention, norms/RoPE/activation, sampling, other). Prints a table; JSON to
argv[2]."""
import json
import os
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from dlrt import LLM

GROUPS = [("gemm", r"gemm|gemv|sm90_xmma|cutlass|nvjet|gemmk|splitK|Kernel2|ampere|sm80"),
          ("attention", r"attn"), ("small", r"rms|rope|silu|norm"),
          ("sampling", r"slice|merge_kernel|sample|greedy|_max_kernel|_pass|_race|_pick"),
          ("other", r".")]


def group(name: str) -> str:
    for g, pat in GROUPS:
        if re.search(pat, name, re.I):
            return g
    return "other"


def summarize(events) -> dict:
    ks = sorted((e.time_range.start, e.time_range.end, e.name) for e in events)
    busy, cur_s, cur_e = 0.0, None, None
    gaps = []
    for s, e, _ in ks:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = ks[-1][1] - ks[0][0]
    per = {}
    for s, e, n in ks:
        g = group(n)
        per.setdefault(g, [0.0, 0])
        per[g][0] += e - s
        per[g][1] += 1
    top = {}
    for s, e, n in ks:
        top.setdefault(n[:70], [0.0, 0])
        top[n[:70]][0] += e - s
        top[n[:70]][1] += 1
    gaps.sort()
    return {"kernels": len(ks), "span_us": span, "busy_us": busy,
            "gaps_total_us": sum(gaps), "gap_median_us": gaps[len(gaps) // 2] if gaps else 0,
            "gaps_over_2us": sum(1 for g in gaps if g > 2), "groups": per,
            "top": sorted(([k, v[0], v[1]] for k, v in top.items()), key=lambda r: -r[1])[:25]}


def main(model: str, out: str) -> None:
    llm = LLM(model, load_format="dummy", max_model_len=4096)
    prompt = list(range(100, 140))
    opts = dict(max_new_tokens=48, temperature=0, block_length=4, ignore_eos=True,
                remasking_strategy="low_confidence_static")
    res = {}
    for mode in ("device_loop", "host_loop"):
        llm.set_execution_mode(mode)
        llm.generate(prompt, **opts)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            r = llm.generate(prompt, **opts)
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
              and e.time_range.end > e.time_range.start]
        if not ev:
            print(mode, "no kernels recorded")
            continue
        s = summarize(ev)
        s["rounds"] = r.timings.get("rounds")
        res[mode] = s
        print(f"{mode}: {s['kernels']} kernels, span {s['span_us']:.0f} us, busy "
              f"{s['busy_us']:.0f} us ({100 * s['busy_us'] / s['span_us']:.1f}%), gaps "
              f"{s['gaps_total_us']:.0f} us (median {s['gap_median_us']:.2f}, >2us: "
              f"{s['gaps_over_2us']}), rounds {s['rounds']}")
        for g, (t, c) in sorted(s["groups"].items(), key=lambda kv: -kv[1][0]):
            print(f"  {g:<10} {t:9.0f} us  {c:6d} kernels  {t / max(c, 1):6.2f} us each")
        for name, t, c in s["top"][:12]:
            print(f"    {name:<70} {t:8.0f} us {c:5d}x {t / c:6.2f}")
    rec = {"commit": os.environ.get("DLRT_COMMIT"), "device": torch.cuda.get_device_name(),
           "command": " ".join(sys.argv), **res}
    json.dump(rec, open(f"{out}/round-profile.json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
