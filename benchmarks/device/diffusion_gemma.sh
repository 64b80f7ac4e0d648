#!/usr/bin/env bash
# DiffusionGemma on one GPU, dummy weights: `dlrt bench step` (the renoising round of a canvas of
# the config's canvas_length, 256, in the device loop, against its HBM floor, with the floor's
# parts) per context, in BF16 and in FP8 (online quantisation; where the family cannot be
# quantised yet, the refusal is printed and FP8 skipped); then the tok/s of requests of fixed
# rounds (max_denoising_steps 16 with stopping disabled: stability_threshold 1000000 can never
# be met in 16 rounds; confidence_threshold must be > 0, so 1e-30) over a few canvases, EOS
# ignored, in the device loop; ends with one table (diffusion_gemma_table.py).
# Usage: bash benchmarks/device/diffusion_gemma.sh [--context LIST] [--rounds N] \
#            [--num-prompts N] [--max-new-tokens N] [--modes LIST] [MODEL] [-- extra flags]
#   MODEL            a folder under .devtools/models (default DiffusionGemma-26B-A4B-it)
#   --context        bench step's contexts (default 0,4096); --rounds: its rounds (default 20)
#   --num-prompts N  timed requests (default 3, after one warm-up); --max-new-tokens: default
#                    1024 (4 canvases of 256); --modes: execution modes (default device_loop)
#   -- flags         given to both commands (e.g. --device cpu on a machine without a GPU)
# Carry: .devtools (.whl when needed). Records: $OUT/step/{bf16,fp8}, $OUT/tps/{bf16,fp8}.
set -uo pipefail
source benchmarks/device/common.sh
model=DiffusionGemma-26B-A4B-it context=0,4096 rounds=20 prompts=3 new=1024 modes=device_loop
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --context) context=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --num-prompts) prompts=$2; shift 2 ;;
    --max-new-tokens) new=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -*) sed -n 9,15p "$0"; exit 2 ;;
    *) model=$1; shift ;;
  esac
done
[ -d "$M/$model" ] || { echo "no model folder $M/$model"; exit 2; }

# run NAME TIMEOUT CMD...: CMD's output into $OUT/NAME.log and run.log; 0 when it succeeded,
# else its status after printing its error line (or last lines).
run() {
  local name=$1 limit=$2; shift 2
  echo "== $name" >> "$LOG"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  cat "$OUT/$name.log" >> "$LOG"
  if [ $rc != 0 ]; then
    echo "$name failed (rc $rc): $(grep -m1 '^error:' "$OUT/$name.log" || tail -n 3 "$OUT/$name.log")"
  fi
  return $rc
}

forms=()
for form in bf16 fp8; do
  quant=()
  [ $form = fp8 ] && quant=(--quantization fp8)
  if run "step-$form" "${STEP_TIMEOUT:-500}" python3 -m dlrt bench step --model "$M/$model" \
      --load-format dummy --context "$context" --rounds "$rounds" "${quant[@]}" \
      --out "$OUT/step/$form" "${extra[@]}"; then
    forms+=("$form")
  elif [ $form = fp8 ]; then
    echo "FP8: not measured (the refusal above: no online FP8 for this family yet)"
  fi
  elapsed "step $form done"
done

# NOTE: stopping disabled: every canvas runs its 16 rounds (the renoise options' ranges:
# stability_threshold in [0, 2^63), confidence_threshold > 0)
fixed=(--max-denoising-steps 16 --stability-threshold 1000000 --confidence-threshold 1e-30)
for form in "${forms[@]}"; do
  quant=()
  [ $form = fp8 ] && quant=(--quantization fp8)
  run "tps-$form" "${TPS_TIMEOUT:-500}" python3 -m dlrt bench humaneval --model "$M/$model" \
      --load-format dummy --num-prompts "$prompts" --modes "$modes" --max-new-tokens "$new" \
      --ignore-eos --max-model-len $(( new + 1024 )) "${fixed[@]}" "${quant[@]}" \
      --out "$OUT/tps/$form" "${extra[@]}"
  elapsed "tps $form done"
done
python3 benchmarks/device/diffusion_gemma_table.py "$OUT"
elapsed total
