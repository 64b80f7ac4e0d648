#!/usr/bin/env bash
# Tensor parallelism on a two-GPU host (nvidia-h200-x2): the all-reduce's GPU tests (two
# processes on one GPU, and on two GPUs) and the two-GPU token tests, the fused all-reduce
# against NCCL at a round's message sizes, then `dlrt bench step` of SDAR-8B at TP=1 and TP=2
# alternating (one process per run; TP=2 under torchrun), then SDAR-30B-A3B at TP=2.
# Usage: bash benchmarks/device/tensor_parallel.sh [--no-tests] [--context LIST]
#          [--models "MODEL..."] [--moe MODEL]
#   MODEL: folders under .devtools/models; defaults SDAR-8B-Chat and SDAR-30B-A3B-Chat
# Carry: .devtools. Records: $OUT/step/tpN-MODEL, $OUT/tp_all_reduce; tests $OUT/tests.txt.
set -uo pipefail
source benchmarks/device/common.sh
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
tests=1 context=0 models="SDAR-8B-Chat" moe=SDAR-30B-A3B-Chat
while [ $# -gt 0 ]; do
  case $1 in
    --no-tests) tests=0; shift ;;
    --context) context=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --moe) moe=$2; shift 2 ;;
    *) sed -n 5,9p "$0"; exit 2 ;;
  esac
done
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
if [ $tests = 1 ]; then
  timeout 400 python3 -m pytest -q -m gpu tests/kernels/test_all_reduce.py \
    tests/e2e/test_tensor_parallel_gpu.py -p no:cacheprovider -rf -s > "$OUT/tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed|error)|differ from one GPU" "$OUT/tests.txt" \
    | tail -14
  elapsed "tests"
fi
timeout 200 "${TORCHRUN[@]}" benchmarks/tp_all_reduce.py --out "$OUT/tp_all_reduce" \
  >> "$LOG" 2>&1 || echo "tp_all_reduce failed"
grep -A7 "^message" "$LOG" | tail -7
elapsed "all-reduce"
step() {  # step TP MODEL
  local launcher=(python3) tp=$1 model=$2
  [ "$tp" -gt 1 ] && launcher=("${TORCHRUN[@]}")
  echo "== tp$tp $model $context" >> "$LOG"
  timeout 300 "${launcher[@]}" -m dlrt bench step --model "$M/$model" --load-format dummy \
    --context "$context" --rounds 100 --temperature 0 \
    --remasking-strategy low_confidence_static --tensor-parallel-size "$tp" \
    --out "$OUT/step/tp$tp-$model" >> "$LOG" 2>&1 || echo "tp$tp $model failed"
  elapsed "tp$tp $model"
}
for model in $models; do
  for tp in 1 2 1 2; do step $tp "$model"; done
done
[ -n "$moe" ] && step 2 "$moe"
python3 benchmarks/device/summarize.py "$OUT/step"
