"""One line per bench-step row of the JSON records in a folder (model, DLRT_ env, context,
device-loop round, floor ratio, stage breakdown, projections on Triton), then the HumanEval
request summaries per execution mode."""
import json
import sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("step-*.json")):
    rec = json.loads(path.read_text())
    env = " ".join(f"{k[5:]}={v}" for k, v in rec.get("env", {}).items() if k != "DLRT_COMMIT"
                   and k != "DLRT_CACHE_DIR")
    proj = rec.get("projections", {})
    tri = sum(1 for r in proj.values() if r.get("chosen") == "triton")
    layer = proj.pop("layer", {}).get("chosen", "-")
    for row in rec["rows"]:
        stages = " ".join(f"{k[:-3]}={row[k]:.0f}" for k in
                          ("attention_us", "gemm_us", "sampling_us", "other_us") if k in row)
        print(f"{rec['model'].split('/')[-1]:<14} {rec.get('commit', '-'):<8} "
              f"{rec.get('attention', '-'):<14} {env:<30} "
              f"ctx={row['context']:<6} "
              f"loop={row['device_loop_us']:.0f} bubble={row['host_bubble_us']:.0f} "
              f"floor={row['floor_us']:.0f} ratio={row['ratio_to_floor']:.3f} {stages} "
              f"triton_proj={tri}/{len(proj)} layer={layer}")

for path in sorted(Path(sys.argv[1]).glob("humaneval-*.json")):
    rec = json.loads(path.read_text())
    for mode, res in rec.get("modes", {}).items():
        s = res["summary"]
        print(f"{rec['model'].split('/')[-1]:<14} humaneval {mode:<12} tps={s['mean_tps']:.1f} "
              f"ms/round={s['mean_ms_per_round']:.3f} tpf={s['mean_tpf']:.3f} "
              f"rounds/block={s['rounds_per_block']:.2f}")
    for c in rec.get("compare", []):
        print(f"{'':<14} compare {c}")
