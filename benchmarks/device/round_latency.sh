#!/usr/bin/env bash
# Round latency (`dlrt bench step`: the device loop's round against the HBM floor) per model and
# context, one process per run; with --base, an older tree in the same call (base and head runs
# alternating), then greedy token identity base vs head; ends with one table (summarize.py).
# Usage: bash benchmarks/device/round_latency.sh [--base DIR] [--repeat N] [--context LIST] \
#            MODEL... [-- extra bench-step flags]
#   MODEL      a folder under .devtools/models: SDAR-1.7B-Chat, SDAR-8B-Chat, LLaDA-8B-Instruct...
#   --base DIR a plain copy of the older tree; its runs cd there with PYTHONPATH=DIR (they import
#              its code, never this tree's); DIR/.devtools/commit names it (else "base")
#   --repeat N runs per tree (default 2 with --base, else 1); --context: default 0
#   e.g. round_latency.sh --context 256 LLaDA-8B-Instruct -- --block-length 32
# Carry: .devtools, DIR when given, .whl when the runs need wheels. Records: $OUT/step/{base,head}.
set -uo pipefail
source benchmarks/device/common.sh
base= repeat= context=0 models=() extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || { sed -n 5,12p "$0"; exit 2; }
trees=(head)
[ -n "$base" ] && trees=(base head)
repeat=${repeat:-$(( ${#trees[@]} == 2 ? 2 : 1 ))}

# in_tree TREE CMD...: CMD in this tree, or in the base copy with only its code importable.
in_tree() {
  local tree=$1; shift
  if [ "$tree" = base ]; then
    (cd "$base" && PYTHONPATH=$base${SITE_PATH:+:$SITE_PATH} DLRT_CACHE_DIR=/tmp/dlrt-cache-base \
        DLRT_COMMIT=$(cat .devtools/commit 2>/dev/null || echo base) "$@")
  else
    "$@"
  fi
}

step() {  # step TREE MODEL
  echo "== $2 $1" >> "$LOG"
  in_tree "$1" timeout "${STEP_TIMEOUT:-300}" python3 -m dlrt bench step --model "$M/$2" \
      --load-format dummy --context "$context" --rounds 100 --temperature 0 \
      --remasking-strategy low_confidence_static --out "$OUT/step/$1" "${extra[@]}" \
      >> "$LOG" 2>&1 || echo "$2 $1: bench step failed (see run.log)"
}

for i in $(seq "$repeat"); do
  for m in "${models[@]}"; do
    for t in "${trees[@]}"; do step "$t" "$m"; done
  done
  elapsed "pass $i done"
done

ids=$(seq -s, 1000 37 2443)  # a fixed 40-token prompt
tokens() {  # tokens TREE MODEL: greedy generate, its JSON in $OUT/tokens/MODEL-TREE.json
  in_tree "$1" timeout 300 python3 -m dlrt generate --model "$M/$2" --load-format dummy \
      --prompt-ids "$ids" --max-new-tokens 64 --temperature 0 --json \
      > "$OUT/tokens/$2-$1.json" 2>> "$LOG"
}
if [ -n "$base" ]; then
  mkdir -p "$OUT/tokens"
  for m in "${models[@]}"; do
    tokens base "$m"; tokens head "$m"
    python3 - "$m" "$OUT/tokens/$m-base.json" "$OUT/tokens/$m-head.json" <<'PY'
import json, sys
try:
    a, b = (json.loads(open(p).read().splitlines()[-1])["token_ids"] for p in sys.argv[2:])
    print(f"{sys.argv[1]}: greedy tokens base vs head: {'SAME' if a == b else 'DIFFERENT'}")
except (OSError, IndexError, KeyError, ValueError) as e:
    print(f"{sys.argv[1]}: token check failed ({e!r}; see run.log)")
PY
  done
fi
python3 benchmarks/device/summarize.py "$OUT/step"
elapsed total
