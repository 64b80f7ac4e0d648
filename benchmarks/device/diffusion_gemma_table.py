"""The table of `diffusion_gemma.sh`: DiffusionGemma's round against its floor and its requests'
tok/s, per weight form (the folder a record is in: bf16, fp8).

    python3 benchmarks/device/diffusion_gemma_table.py OUT_DIR

Reads OUT_DIR/step/<form>/step-*.json (`dlrt bench step`) and OUT_DIR/tps/<form>/
humaneval-*.json (`dlrt bench humaneval`). Prints per form and context the timed round (the
device loop's; the eager one in a record timed eagerly, off CUDA), the HBM floor, their ratio
and the floor's parts in MB; the stage breakdown where the record has one; per form and
execution mode the requests' tok/s, ms a round, canvases and rounds per canvas.
"""

import json
import sys
from pathlib import Path

from dlrt.bench.report import table

PARTS = ("weights", "lm_head", "experts", "kv", "renoise")
STAGES = ("attention_us", "gemm_us", "moe_us", "sampling_us", "other_us")


def records(root: Path, kind: str) -> list[tuple[str, dict]]:
    """(form, record) of every OUT/<kind>/<form>/<name>-*.json, by form then time."""
    name = "step" if kind == "step" else "humaneval"
    found = [(p.parent.name, json.loads(p.read_text()))
             for p in (root / kind).glob(f"*/{name}-*.json")]
    return sorted(found, key=lambda f: (f[0], f[1].get("time", "")))


def step_rows(found: list[tuple[str, dict]]) -> list[dict]:
    rows = []
    for form, rec in found:
        timed = rec["summary"].get("timed", "device_loop")
        for r in rec["rows"]:
            us = r[f"{timed}_us"]
            rows.append(dict(form=form, context=r["context"], timed=timed, round_us=us,
                             floor_us=r["floor_us"], ratio=r["ratio_to_floor"],
                             GBps=r["GBps"], rows=rec["summary"]["block_length"],
                             **{f"{k}_MB": r.get(f"{k}_bytes", 0) / 1e6 for k in PARTS},
                             **{k: r[k] for k in STAGES if k in r}))
    return rows


def tps_rows(found: list[tuple[str, dict]]) -> list[dict]:
    rows = []
    for form, rec in found:
        for mode, run in rec["modes"].items():
            s, reqs = run["summary"], run["rows"]
            rows.append(dict(form=form, mode=mode, requests=s["requests"],
                             new_tokens=s["new_tokens"], tok_per_s=s["mean_tps"],
                             ms_per_round=s["mean_ms_per_round"],
                             canvases=sum(r["blocks"] for r in reqs) / len(reqs),
                             rounds_per_canvas=s["rounds_per_block"],
                             steps=rec["options"].get("max_denoising_steps")))
    return rows


def main(root: Path) -> int:
    steps, tps = step_rows(records(root, "step")), tps_rows(records(root, "tps"))
    if not steps and not tps:
        print(f"no bench step or humaneval records under {root}")
        return 1
    if steps:
        print(table(steps, ["form", "context", "rows", "timed", "round_us", "floor_us", "ratio",
                            "GBps", *(f"{k}_MB" for k in PARTS)]))
        if any(k in r for r in steps for k in STAGES):
            print(table(steps, ["form", "context", *STAGES]))
    if tps:
        print(table(tps, ["form", "mode", "steps", "requests", "new_tokens", "canvases",
                          "rounds_per_canvas", "ms_per_round", "tok_per_s"]))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
