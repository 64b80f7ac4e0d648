#!/usr/bin/env bash
# LLaDA's canvas caches on one GPU, dummy weights, BF16, the device loop: `dlrt bench step
# --prompt-lengths` (per prompt length the exact round, then the run's rounds: a cache's refresh
# and window, or the smoothed exact round; each against its own HBM floor and over the exact
# round), one process per run: dual, prefix, dual with a vicinity, dual with iteration smoothing
# (the exact and smoothed exact rounds, the smoothed refresh and window), per model; ends with one table
# (llada_caches_table.py). Runs stop being started once $BUDGET_S seconds (default 420) are
# spent; each may take $STEP_TIMEOUT seconds (default 240) at most.
# Usage: bash benchmarks/device/llada_caches.sh [--prompts LIST] [--max-new-tokens N] \
#            [--block-length N] [--vicinity N] [--rounds N] [MODEL...] [-- extra flags]
#   MODEL         folders under .devtools/models (default: $LLADA_MODELS, else
#                 LLaDA-8B-Instruct LLaDA-MoE-7B-A1B-Instruct)
#   --prompts     prompt lengths (default 128,1024); --max-new-tokens: default 256;
#   --block-length: default 32; --vicinity N: the vicinity run's before and after (default 4);
#   --rounds      rounds per timing (default 20)
#   -- flags      given to every run (e.g. --device cpu on a machine without a GPU)
# Carry: .devtools. Records: $OUT/step/MODEL/RUN (RUN: dual, prefix, dual-vicinity, smoothing).
set -uo pipefail
source benchmarks/device/common.sh
prompts=128,1024 new=256 block=32 vicinity=4 rounds=20 models=() extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --prompts) prompts=$2; shift 2 ;;
    --max-new-tokens) new=$2; shift 2 ;;
    --block-length) block=$2; shift 2 ;;
    --vicinity) vicinity=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -*) sed -n 9,17p "$0"; exit 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || read -ra models <<< "${LLADA_MODELS:-LLaDA-8B-Instruct LLaDA-MoE-7B-A1B-Instruct}"
for m in "${models[@]}"; do
  [ -d "$M/$m" ] || { echo "no model folder $M/$m"; exit 2; }
done
budget=${BUDGET_S:-420}

declare -A flags=(
  [dual]="--canvas-cache dual"
  [prefix]="--canvas-cache prefix"
  [dual-vicinity]="--canvas-cache dual --vicinity-before $vicinity --vicinity-after $vicinity"
  [smoothing]="--canvas-cache dual --smoothing"
)
for m in "${models[@]}"; do
  for r in dual prefix dual-vicinity smoothing; do
    left=$(( budget - ($(date +%s) - t0) ))
    if [ $left -lt 30 ]; then
      echo "$m $r: not run (${budget} s spent)"
      continue
    fi
    limit=$(( left < ${STEP_TIMEOUT:-240} ? left : ${STEP_TIMEOUT:-240} ))
    echo "== $m $r" >> "$LOG"
    # shellcheck disable=SC2086  # the run's flags are words
    timeout "$limit" python3 -m dlrt bench step --model "$M/$m" --load-format dummy \
        --dtype bfloat16 --prompt-lengths "$prompts" --max-new-tokens "$new" \
        --block-length "$block" --remasking-strategy threshold --temperature 0 \
        --rounds "$rounds" ${flags[$r]} --out "$OUT/step/$m/$r" "${extra[@]}" \
        > "$OUT/$m-$r.log" 2>&1
    rc=$?
    cat "$OUT/$m-$r.log" >> "$LOG"
    if [ $rc != 0 ]; then
      echo "$m $r: not measured (rc $rc): $(grep -m1 '^error:' "$OUT/$m-$r.log" || tail -n 2 "$OUT/$m-$r.log")"
    fi
    elapsed "$m $r done"
  done
done
python3 benchmarks/device/llada_caches_table.py "$OUT"
elapsed total
