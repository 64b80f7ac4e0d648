#!/usr/bin/env bash
# Tensor parallelism on a two-GPU host (nvidia-h200-x2), one PART per device call (each fits
# the 10-minute limit):
#   ar-tests   the all-reduce's GPU tests (two and three processes on one GPU, two GPUs)
#   e2e-tests  the two-GPU token tests (every rank and mode identical; fp32 = one GPU)
#   ar-bench   the fused peer-to-peer all-reduce against NCCL at a round's message sizes
#   steps      `dlrt bench step` of MODELS at TP=1 and TP=2 alternating (one process per run;
#              TP=2 under torchrun), then MOE at TP=2
# Usage: bash benchmarks/device/tensor_parallel.sh PART... [--context LIST]
#          [--models "MODEL..."] [--moe MODEL]
#   MODEL: folders under .devtools/models; defaults SDAR-8B-Chat and SDAR-30B-A3B-Chat ("" skips)
# Carry: .devtools. Records: $OUT/step/tpN-MODEL, $OUT/tp_all_reduce; tests $OUT/*tests.txt.
set -uo pipefail
source benchmarks/device/common.sh
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
parts=() context=0 models="SDAR-8B-Chat" moe=SDAR-30B-A3B-Chat
while [ $# -gt 0 ]; do
  case $1 in
    ar-tests|e2e-tests|ar-bench|steps) parts+=("$1"); shift ;;
    --context) context=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --moe) moe=$2; shift 2 ;;
    *) sed -n 2,12p "$0"; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || { sed -n 2,12p "$0"; exit 2; }
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
tests() {  # tests NAME TIMEOUT FILE...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -m gpu "$@" -p no:cacheprovider -rf -s \
    > "$OUT/$name.txt" 2>&1
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed|error)|differ from one GPU" "$OUT/$name.txt" \
    | tail -14
  elapsed "$name"
}
step() {  # step TP MODEL
  local launcher=(python3) tp=$1 model=$2
  [ "$tp" -gt 1 ] && launcher=("${TORCHRUN[@]}")
  echo "== tp$tp $model $context" >> "$LOG"
  timeout 240 "${launcher[@]}" -m dlrt bench step --model "$M/$model" --load-format dummy \
    --context "$context" --rounds 100 --temperature 0 \
    --remasking-strategy low_confidence_static --tensor-parallel-size "$tp" \
    --out "$OUT/step/tp$tp-$model" >> "$LOG" 2>&1 || echo "tp$tp $model failed"
  elapsed "tp$tp $model"
}
for part in "${parts[@]}"; do
  case $part in
    ar-tests) tests ar-tests 540 tests/kernels/test_all_reduce.py ;;
    e2e-tests) tests e2e-tests 560 tests/e2e/test_tensor_parallel_gpu.py ;;
    ar-bench)
      timeout 300 "${TORCHRUN[@]}" benchmarks/tp_all_reduce.py --out "$OUT/tp_all_reduce" \
        >> "$LOG" 2>&1 || echo "tp_all_reduce failed"
      grep -A7 "^message" "$LOG" | tail -7
      elapsed "all-reduce" ;;
    steps)
      for model in $models; do
        for tp in 1 2 1 2; do step $tp "$model"; done
      done
      [ -n "$moe" ] && step 2 "$moe"
      python3 benchmarks/device/summarize.py "$OUT/step" ;;
  esac
done
