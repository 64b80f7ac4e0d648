#!/usr/bin/env bash
# A peer engine beside dlrt in one call: LMDeploy 0.18.0's PyTorch engine (.peers/run_peer.sh:
# one 120-token HumanEval prompt, best of 3 after a warm-up), then dlrt's request_tps.sh on the
# same configs (device loop, mean over 4 HumanEval prompts); both with random weights, batch 1,
# block 4, 4 steps, low_confidence_static, greedy, 128 new tokens, EOS ignored. Prints one line
# per config: LMDeploy round and request TPS, dlrt ms a round and request TPS. LMDeploy runs T+1
# forwards per block (the last writes the block's K/V): compare request TPS.
# Usage: bash benchmarks/device/peer.sh CONFIG...   CONFIG: sdar17, sdar8 or moe (SDAR-1.7B,
#        SDAR-8B, SDAR-30B-A3B)
# Carry: .devtools, .peers (../shared/peers/fetch.sh writes it). Records: $OUT/peer.json,
# $OUT/humaneval/.
set -uo pipefail
source benchmarks/device/common.sh
[ $# -gt 0 ] || { sed -n 8,9p "$0"; exit 2; }
bash .peers/run_peer.sh "$@"
models=()
for c in "$@"; do
  case $c in
    sdar17) models+=(SDAR-1.7B-Chat) ;; sdar8) models+=(SDAR-8B-Chat) ;;
    moe) models+=(SDAR-30B-A3B-Chat) ;; *) echo "unknown config $c" ;;
  esac
done
[ ${#models[@]} -gt 0 ] && bash benchmarks/device/request_tps.sh --modes device_loop "${models[@]}"
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
peer = {}
if (out / "peer.json").exists():
    for line in (out / "peer.json").read_text().splitlines():
        rec = json.loads(line)
        peer[rec["model"]] = rec
dlrt = {}
for path in sorted(out.glob("humaneval/humaneval-*.json")):
    rec = json.loads(path.read_text())
    dlrt[Path(rec["model"].rstrip("/")).name] = rec["modes"]["device_loop"]["summary"]
print(f"{'config':<18} {'lmdeploy ms':>11} {'lmdeploy TPS':>12} {'dlrt ms':>8} {'dlrt TPS':>9}")
for name in dict.fromkeys([*peer, *dlrt]):
    p, d = peer.get(name, {}), dlrt.get(name, {})
    cells = [p.get("round_ms"), p.get("request_tps"), d.get("mean_ms_per_round"), d.get("mean_tps")]
    print(f"{name:<18} " + " ".join(f"{'-' if v is None else f'{v:.2f}':>{w}}"
                                    for v, w in zip(cells, (11, 12, 8, 9))))
PY
elapsed total
