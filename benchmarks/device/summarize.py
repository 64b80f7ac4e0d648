"""Round latency per model and context from the `dlrt bench step` records under a folder.

    python3 benchmarks/device/summarize.py OUT_DIR

Reads every step-*.json below OUT_DIR (but the rows per prompt length of `--prompt-lengths`
records: llada_caches_table.py's). A record's tree is the name of its folder when that is
below OUT_DIR (round_latency.sh writes `base` and `head`, persistent_round.sh `layers` and
`persistent`; tags such as `bf16` and `w8a8`), else its `commit`. Prints per model, context and
tree the device-loop round of every run in run order, their median, the HBM floor and, with two
or more trees, each tree's median over the reference tree's (`base`, `bf16` or `layers`, else
the first one run).
"""

import json
import statistics
import sys
from pathlib import Path


def load(root: Path) -> dict[tuple[str, int], dict[str, list[dict]]]:
    """(model, context) -> tree -> rows in run order (each with the record's commit)."""
    found = []
    for path in root.rglob("step-*.json"):
        rec = json.loads(path.read_text())
        tree = path.parent.name if path.parent != root else rec.get("commit")
        found.append((rec.get("time", ""), str(path), tree or "unknown", rec))
    table: dict[tuple[str, int], dict[str, list[dict]]] = {}
    for _, _, tree, rec in sorted(found, key=lambda f: f[:2]):
        model = Path(rec["model"].rstrip("/")).name
        for row in rec["rows"]:
            if "context" not in row:  # a canvas record's rows (--prompt-lengths): its own table
                continue
            runs = table.setdefault((model, row["context"]), {}).setdefault(tree, [])
            runs.append({**row, "commit": rec.get("commit", "-")})
    return table


def main(root: Path) -> int:
    table = load(root)
    if not table:
        print(f"no step-*.json records under {root}")
        return 1
    print(f"{'model':<18} {'context':>7}  {'tree':<12} {'commit':<9} {'median':>8} "
          f"{'floor':>6} {'ratio':>5} {'vs ref':>6}  device-loop rounds in us, in run order")
    for (model, context), trees in sorted(table.items()):
        ref = next((t for t in ("base", "bf16", "layers") if t in trees), next(iter(trees)))
        ref_median = statistics.median(r["device_loop_us"] for r in trees[ref])
        for tree, runs in trees.items():
            median = statistics.median(r["device_loop_us"] for r in runs)
            floor = statistics.median(r["floor_us"] for r in runs)
            vs = f"{median / ref_median:.3f}" if len(trees) > 1 else "-"
            commits = ",".join(dict.fromkeys(r["commit"] for r in runs))
            rounds = " ".join(f"{r['device_loop_us']:.0f}" for r in runs)
            print(f"{model:<18} {context:>7}  {tree:<12} {commits:<9} {median:>8.1f} "
                  f"{floor:>6.0f} {median / floor:>5.2f} {vs:>6}  {rounds}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
