#!/usr/bin/env bash
# Request TPS per execution mode (`dlrt bench humaneval`): dummy weights, greedy,
# low_confidence_static, block 4, 4 denoising steps, 128 new tokens, EOS ignored, HumanEval
# prompts (in the chat template when the model folder has a tokenizer); prints each model's
# compare table (TPS, ms a round, TPF, same tokens as the first mode).
# Usage: bash benchmarks/device/request_tps.sh [--modes LIST] [--num-prompts N] MODEL...
#   MODEL: a folder under .devtools/models; --modes default device_loop,host_loop; N default 4
# Carry: .devtools (.whl when needed). Records: $OUT/humaneval/humaneval-MODEL-*.json.
set -uo pipefail
source benchmarks/device/common.sh
modes=device_loop,host_loop num=4 models=()
while [ $# -gt 0 ]; do
  case $1 in
    --modes) modes=$2; shift 2 ;;
    --num-prompts) num=$2; shift 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || { sed -n 6,7p "$0"; exit 2; }
for m in "${models[@]}"; do
  chat=()
  ls "$M/$m"/tokenizer*.json >/dev/null 2>&1 && chat=(--chat)
  echo "== $m" | tee -a "$LOG"
  timeout "${TPS_TIMEOUT:-400}" python3 -m dlrt bench humaneval --model "$M/$m" \
      --load-format dummy --num-prompts "$num" --modes "$modes" --temperature 0 \
      --remasking-strategy low_confidence_static --block-length 4 --denoising-steps 4 \
      --max-new-tokens 128 --ignore-eos "${chat[@]}" --out "$OUT/humaneval" > "$OUT/tps-$m.log" 2>&1
  rc=$?
  cat "$OUT/tps-$m.log" >> "$LOG"
  awk '/^ *mode +mean_tps/ {p = 1} /^wrote/ {p = 0} p' "$OUT/tps-$m.log"
  [ $rc = 0 ] || { echo "$m: bench humaneval failed (rc $rc):"; tail -n 5 "$OUT/tps-$m.log"; }
  elapsed "$m done"
done
