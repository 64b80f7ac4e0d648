"""The table of `llada_caches.sh`: LLaDA's canvas rounds per model, prompt length and run.

    python3 benchmarks/device/llada_caches_table.py OUT_DIR

Reads OUT_DIR/step/<model>/<run>/step-*.json (`dlrt bench step --prompt-lengths`). Prints per
model, prompt length and run the timed exact round (the device loop's; the eager one in a
record timed eagerly, off CUDA) and its ratio to its floor; the run's refresh round and its
ratio (a cache's); the run's repeated round (a cache's window, or the smoothed exact round),
its ratio to its floor and its speedup over the exact round. Then, per dual window without a
vicinity, whether it met the target: at most 1.25x its floor and at least 3x faster than the
exact round at the same prompt length.
"""

import json
import sys
from pathlib import Path

from dlrt.bench.report import table

COLUMNS = ["model", "prompt", "run", "timed", "exact_us", "exact_ratio", "refresh_us",
           "refresh_ratio", "round", "round_us", "round_ratio", "speedup"]
RATIO, SPEEDUP = 1.25, 3.0  # the dual window's target


def records(root: Path) -> list[tuple[str, str, dict]]:
    """(model, run, record) of every OUT/step/<model>/<run>/step-*.json, in that order."""
    found = [(p.parent.parent.name, p.parent.name, json.loads(p.read_text()))
             for p in (root / "step").glob("*/*/step-*.json")]
    return sorted(found, key=lambda f: (f[0], f[1], f[2].get("time", "")))


def rows(found: list[tuple[str, str, dict]]) -> list[dict]:
    out = []
    for model, run, rec in found:
        timed = rec["summary"]["timed"]
        for prompt in rec["prompt_lengths"]:
            by = {(r["round"], r["smoothing"]): r for r in rec["rows"] if r["prompt"] == prompt}
            exact = by[("exact", False)]
            last = (by.get(("window", True)) or by.get(("window", False))
                    or by.get(("exact", True)) or exact)
            refresh = by.get(("refresh", True)) or by.get(("refresh", False)) or {}
            out.append(dict(
                model=model, prompt=prompt, run=run, timed=timed,
                exact_us=exact[f"{timed}_us"], exact_ratio=exact["ratio_to_floor"],
                refresh_us=refresh.get(f"{timed}_us"), refresh_ratio=refresh.get("ratio_to_floor"),
                round=last["round"] + ("/smoothed" if last.get("smoothing") else ""),
                round_us=last[f"{timed}_us"], round_ratio=last["ratio_to_floor"],
                speedup=last["speedup"], cache=last["cache"], vicinity=last["vicinity"]))
    return out


def targets(table_rows: list[dict]) -> list[str]:
    """One line per dual window without a vicinity: its ratio and speedup against the
    target."""
    lines = []
    for r in table_rows:
        if r["cache"] != "dual" or r["vicinity"] != "0/0" or r["round"] != "window":
            continue
        met = r["round_ratio"] <= RATIO and r["speedup"] >= SPEEDUP
        lines.append(f"{r['model']} prompt {r['prompt']}: the dual window round is "
                     f"{r['round_ratio']:.2f}x its floor (target <= {RATIO}) and "
                     f"{r['speedup']:.2f}x faster than the exact round (target >= {SPEEDUP}): "
                     f"{'met' if met else 'not met'} ({r['timed']})")
    return lines


def main(root: Path) -> int:
    found = records(root)
    if not found:
        print(f"no bench step --prompt-lengths records under {root}/step")
        return 1
    table_rows = rows(found)
    print(table(table_rows, COLUMNS))
    for line in targets(table_rows):
        print(line)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
