#!/usr/bin/env bash
# GSM8K through lm-evaluation-harness (`dlrt eval --model dlrt`) as a local task over the 1,319
# test problems, on a real config with dummy weights: the time and tok/s of the harness's
# generate_until requests (greedy, EOS ignored, so each runs to --max-gen-toks unless the
# random tokens spell a stop string; the accuracy of random weights is meaningless).
# Usage: bash benchmarks/device/gsm8k_harness.sh [--limit N] [--fewshot K] [--max-gen-toks N] \
#            [--device D] [MODEL] [-- extra model_args, comma-separated]
#   MODEL           a folder under .devtools/models with tokenizer files (default SDAR-8B-Chat;
#                   cp dlrt/data/sdar-qwen3/* .devtools/models/SDAR-8B-Chat/)
#   --limit N       the first N problems (default: all 1,319; a 10-minute call holds a few
#                   hundred at 256 new tokens); --fewshot K: examples in each prompt, taken
#                   from the test file itself (default 5, GSM8K's); --max-gen-toks: default 256
#   --device D      the harness's --device (default cuda; cpu on a machine without a GPU)
#   -- ARGS         more model arguments, e.g. -- block_length=4,denoising_steps=4
# Carry: .devtools with data/gsm8k_test.jsonl (cp ../shared/data/gsm8k_test.jsonl
# .devtools/data/) and .whl with lm-eval's wheels (bash benchmarks/device/eval_wheels.sh).
# Records: $OUT/gsm8k/*/results_*.json (the harness's; its config.dlrt holds the timings).
set -uo pipefail
source benchmarks/device/common.sh
model=SDAR-8B-Chat limit= fewshot=5 gen=256 device=cuda extra=
while [ $# -gt 0 ]; do
  case $1 in
    --limit) limit=$2; shift 2 ;;
    --fewshot) fewshot=$2; shift 2 ;;
    --max-gen-toks) gen=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --) shift; extra=${1:-}; break ;;
    -*) sed -n 6,15p "$0"; exit 2 ;;
    *) model=$1; shift ;;
  esac
done
data=$PWD/.devtools/data/gsm8k_test.jsonl
[ -f "$data" ] || { echo "no $data: cp ../shared/data/gsm8k_test.jsonl .devtools/data/"; exit 2; }
[ -d "$M/$model" ] || { echo "no model folder $M/$model"; exit 2; }
ls "$M/$model"/tokenizer_config.json >/dev/null 2>&1 || {
  echo "$M/$model has no tokenizer (the harness sends text): copy one into it"; exit 2; }
python3 -c "import lm_eval, datasets" 2>"$OUT/import.log" || {
  echo "lm-eval cannot be imported (carry .whl: bash benchmarks/device/eval_wheels.sh):"
  tail -n 3 "$OUT/import.log"; exit 2; }

# the task: the harness's gsm8k (5-shot, strict and flexible answer extraction) over the file
tasks=$(mktemp -d)
cat > "$tasks/gsm8k_local.yaml" <<EOF
task: gsm8k_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: $data
test_split: test
fewshot_split: test
output_type: generate_until
doc_to_text: "Question: {{question}}\nAnswer:"
doc_to_target: "{{answer}}"
num_fewshot: $fewshot
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: $gen
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\\$", "(?s).*#### ", "\\\\.\$"]
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
EOF
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_DATASETS_CACHE=$tasks/datasets
args=pretrained=$M/$model,load_format=dummy,ignore_eos=True${extra:+,$extra}
lim=()
[ -n "$limit" ] && lim=(--limit "$limit")
echo "== gsm8k $model ${limit:-all} problems, $fewshot-shot, $gen new tokens, $device" | tee -a "$LOG"
s0=$(date +%s%N)
timeout "${EVAL_TIMEOUT:-560}" python3 -m dlrt eval --model dlrt --model_args "$args" \
    --tasks gsm8k_local --include_path "$tasks" --device "$device" "${lim[@]}" \
    --output_path "$OUT/gsm8k" > "$OUT/gsm8k.log" 2>&1
rc=$?
ms=$(( ($(date +%s%N) - s0) / 1000000 ))
cat "$OUT/gsm8k.log" >> "$LOG"
rm -rf "$tasks"
if [ $rc != 0 ]; then
  echo "dlrt eval failed (rc $rc): $(grep -m1 '^error:' "$OUT/gsm8k.log" || tail -n 5 "$OUT/gsm8k.log")"
  exit $rc
fi
python3 - "$OUT/gsm8k" "$ms" <<'EOF' | tee -a "$LOG"
import json
import sys
from pathlib import Path

(path,) = sorted(Path(sys.argv[1]).glob("*/results_*.json"))[-1:]
rec = json.loads(path.read_text())
gen = rec["config"]["dlrt"]["generate_until"]
em = rec["results"]["gsm8k_local"].get("exact_match,strict-match")
print(f"model      {rec['config']['dlrt']['model']} ({rec['config']['dlrt']['decoder']}, "
      f"{rec['config']['dlrt']['dtype']}, {rec['config']['dlrt']['execution_mode']})")
print(f"problems   {gen['requests']}  (exact_match {em}; random weights)")
print(f"wall       {int(sys.argv[2]) / 1000:.1f} s (load, tasks and requests)")
print(f"generate   {gen['seconds']:.1f} s, {gen['new_tokens']} new tokens, "
      f"{gen['tokens_per_s']:.1f} tok/s, {gen['seconds'] / max(gen['requests'], 1):.3f} s a "
      "request")
print(f"record     {path}")
EOF
elapsed "gsm8k done"
